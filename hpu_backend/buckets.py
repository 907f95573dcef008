"""Shape bucketing policies: a symbol's run-time value → the [lo, hi] range one recipe serves.

Policies (per symbol, or one for all): ``exact`` (one recipe per value), ``exp[:MIN[:MAX]]`` (powers
of two, the default), ``lin:STEP[:MAX]`` (multiples of STEP) and ``list:B1,B2,...`` (explicit upper
boundaries). A value above the largest bucket (``MAX`` or the last boundary) gets an exact bucket
of its own, and a warning that this shape was not warmed.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any
from .errors import HpuBackendError

log = logging.getLogger(__name__)


class BucketError(HpuBackendError, ValueError):
    """A bucket policy that does not parse (raised by ``parse_policy``)."""


FORMS = "exact | exp[:MIN[:MAX]] | lin:STEP[:MAX] | list:B1,B2,..."


@dataclass(frozen=True)
class Policy:
    kind: str  # "exact" | "exp" | "lin" | "list"
    step: int = 1  # lin: STEP; exp: MIN
    limit: int | None = None  # largest bucket's upper end (None: unbounded)
    bounds: tuple[int, ...] = ()

    def bucket(self, v: int) -> tuple[int, int]:
        """The [lo, hi] bucket holding ``v``."""
        if self.kind == "exact" or (self.limit is not None and v > self.limit):
            return (v, v)
        if self.kind == "exp":
            hi = max(self.step, 1 << max(v - 1, 0).bit_length())
            return (0 if hi == self.step else hi // 2 + 1, hi)
        if self.kind == "lin":
            hi = max(self.step, -(-v // self.step) * self.step)
            return (hi - self.step + 1, hi)
        i = bisect.bisect_left(self.bounds, v)
        return (self.bounds[i - 1] + 1 if i else 0, self.bounds[i])

    def overflows(self, v: int) -> bool:
        return self.kind != "exact" and self.limit is not None and v > self.limit

    def spec(self) -> str:
        if self.kind == "list":
            return "list:" + ",".join(map(str, self.bounds))
        if self.kind == "exact":
            return "exact"
        return f"{self.kind}:{self.step}" + (f":{self.limit}" if self.limit is not None else "")


def parse_policy(text: str) -> Policy:
    kind, colon, rest = str(text).strip().partition(":")
    nums = _numbers(text, rest.split("," if kind == "list" else ":")) if colon else []
    if kind == "exact" and not colon:
        return Policy("exact")
    if kind in ("exp", "lin") and len(nums) == 2 and nums[0] > nums[1]:
        what = "MIN" if kind == "exp" else "STEP"
        raise BucketError(f"bucket policy {text!r}: {what} {nums[0]} is above MAX {nums[1]}; forms: {FORMS}")
    if kind == "exp" and len(nums) <= 2:
        return Policy("exp", step=nums[0] if nums else 1, limit=nums[1] if len(nums) > 1 else None)
    if kind == "lin" and len(nums) in (1, 2):
        return Policy("lin", step=nums[0], limit=nums[1] if len(nums) > 1 else None)
    if kind == "list" and nums:
        if any(a >= b for a, b in zip(nums, nums[1:])):  # a typo in a hand-written list, not an order to fix
            raise BucketError(f"bucket policy {text!r}: boundaries must increase (e.g. list:1,4,16); forms: {FORMS}")
        return Policy("list", bounds=tuple(nums), limit=nums[-1])
    raise BucketError(f"bucket policy {text!r} does not parse; forms: {FORMS}")


MAX_BOUND = 2 ** 31 - 1  # a bucket bound past any tensor dimension is a typo


def _numbers(text: str, fields: list[str]) -> list[int]:
    """The numbers after ``KIND:``, every field present (``exp:1:`` has an empty one) and from 1 to MAX_BOUND."""
    stripped = [x.strip() for x in fields]
    if not all(x.isascii() and x.isdigit() for x in stripped):
        raise BucketError(f"bucket policy {text!r}: whole numbers expected between the separators; forms: {FORMS}")
    nums = [int(x) for x in stripped]
    if any(not 1 <= n <= MAX_BOUND for n in nums):
        raise BucketError(f"bucket policy {text!r}: numbers must be from 1 to {MAX_BOUND}; forms: {FORMS}")
    return nums


def policies_for(setting: Any, symbols: list[str]) -> list[Policy]:
    """One policy per symbol from the ``buckets`` setting (a string, or (symbol, spec) pairs)."""
    if isinstance(setting, str):
        p = parse_policy(setting)
        return [p] * len(symbols)
    table = dict(setting)
    unknown = set(table) - set(symbols) - {"*"}
    if unknown:
        log.debug("bucket policies for symbols %s that this graph does not have", sorted(unknown))
    default = table.get("*", "exp")
    return [parse_policy(table.get(s, default)) for s in symbols]


def upper_points(policy: Policy, lo: int, hi: int) -> list[int]:
    """The bucket upper ends a warm-up must visit to cover values lo..hi (each bucket once)."""
    points, v = [], lo
    while v <= hi:
        b = policy.bucket(v)
        points.append(min(b[1], hi) if policy.kind != "exact" else v)
        v = b[1] + 1
    return points
