"""The value ranges of one bucket dimension under vLLM-Gaudi's three strategies (torch-free): ``exponential``
(``warmup_range_with_limit``), ``linear`` (``warmup_range``) and ``padding_aware`` (``warmup_range_with_limits``),
as vllm-gaudi's ``vllm_gaudi/extension/bucketing`` computes them; ``buckets.py`` combines them into a grid.

Each takes the dimension's settings as vLLM-Gaudi logs them ("(min, step, max[, limit | pad_max, pad_percent])")
and returns the values in ascending order. Inputs are checked by the caller (``buckets.read_dim``).
"""

from __future__ import annotations

import itertools
import math
from ...errors import HpuBackendError


class RangeError(HpuBackendError, ValueError):
    """Settings of one dimension that vLLM-Gaudi would reject (its asserts), named by the caller."""


def exponential(lo: int, step: int, hi: int, limit: int, contiguous_pa: bool = False, split: bool = False,
                cap: bool = True) -> list[int]:
    """``limit`` values spaced exponentially from MIN to MAX, each rounded up to a multiple of STEP, duplicates
    dropped. A MIN of 0 or 1 is kept as a bucket of its own while the spacing starts from STEP; with contiguous
    paged attention the last value is MAX itself; with ``cap`` a last value past MAX is lowered to MAX.

    ``split`` (older releases' long-context prompt ranges): limit // 2 values spaced exponentially up to
    MAX / limit, then the rest spaced evenly from there to MAX (MAX alone when limit // 2 is 1 or less)."""
    if limit < 1:
        raise RangeError(f"bucket limit {limit}: expected a positive integer")
    count = limit // 2 if split else limit
    if count <= 1:
        return [hi]
    start = step if lo in (0, 1) else lo
    top = hi / limit if split else hi
    values = set()
    for i in range(count):
        # the exponent is formed as vLLM-Gaudi forms it, so that the rounding up lands on the same multiple
        raw = start * (top / start) ** ((1.0 / float(count - 1)) * i)
        values.add(hi if i == limit - 1 and contiguous_pa else math.ceil(raw / step) * step)
    if split:
        rest = limit - count
        stride = (hi - top) / rest
        values.update(math.ceil((top + i * stride) / step) * step for i in range(1, rest + 1))
    if lo in (0, 1):
        values.add(lo)
    out = sorted(values)
    if cap:
        out[-1] = min(out[-1], hi)
    return out


def linear(lo: int, step: int, hi: int) -> list[int]:
    """MIN doubled while below STEP (and within MAX), then STEP, 2·STEP, ... up to MAX; values below MIN dropped.
    A MIN of 0 adds a 0 bucket after the others (and spaces the rest from STEP)."""
    if lo > hi:
        raise RangeError("MIN is above MAX")
    zero = lo == 0
    if zero:
        if hi == 0:
            return [0]
        lo = step
    ramp = itertools.takewhile(lambda x: x < step and x <= hi, (lo << i for i in itertools.count()))
    out = [v for v in [*ramp, *range(step, hi + 1, step)] if v >= lo]
    return out + [0] if zero else out


def padding_aware(lo: int, step: int, hi: int, pad_max: int, pad_percent: int) -> list[int]:
    """MIN doubled up to STEP (0 is followed by 1), then multiples of STEP, each kept only when skipping it would
    pad past ``pad_percent`` % of the next value or past ``pad_max`` values, or when it is a multiple of
    ``pad_max`` (0: MAX); MAX always last."""
    if lo > hi:
        raise RangeError("MIN is above MAX")
    if not 0 <= pad_percent <= 50:
        raise RangeError(f"PAD_PERCENT {pad_percent}: expected 0 to 50")
    pad_max = pad_max or hi
    out, current = [lo], lo
    while current <= hi:
        last = out[-1]
        if current <= step:  # the ramp: doubling, counted from the last value kept
            nxt = last * 2 or 1
            if nxt <= hi:
                out.append(nxt)
        else:
            nxt = current + step
            padding = nxt - last - 1
            keep = padding / nxt > pad_percent / 100.0 or padding > pad_max or current % pad_max == 0
            if keep and current != last:
                out.append(current)
        current = nxt
    if out[-1] != hi:
        out.append(hi)
    return out


__all__ = ["RangeError", "exponential", "linear", "padding_aware"]
