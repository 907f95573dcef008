"""vLLM-Gaudi's bucket grid, generated from the same environment variables, defaults and strategies; and the
padding rule that maps a batch onto it (torch-free).

Two strategies, as vLLM-Gaudi's bucketing modules generate them (prefix caching off, so every prompt bucket
has no context blocks):

- ``linear`` (vllm-hpu-extension ``bucketing/linear.py``): per dimension a range from
  ``VLLM_{PROMPT,DECODE}_{BS,SEQ,BLOCK}_BUCKET_{MIN,STEP,MAX}``: MIN doubled while below STEP (the ramp-up),
  then STEP, 2·STEP, ... up to MAX. Defaults: prompt batch (1, 32, max_num_prefill_seqs), prompt length
  (block_size, block_size, max_model_len), decode batch (1, 32, max_num_seqs), decode blocks (block_size,
  block_size, the KV cache's blocks). Prompt buckets are every (batch, length) pair whose batch × length fits
  ``max_num_batched_tokens`` (all pairs, if none does); decode buckets every (batch, blocks) with batch ≤
  blocks, the blocks capped at the cache's block count.
- ``exponential`` (vllm-gaudi ``bucketing/exponential.py``, the default): ranges fixed by the engine limits
  (the variables are ignored), ``limit`` values spaced exponentially from MIN to MAX and rounded up to STEP;
  from max_model_len 8192 on, the prompt length range spends half its buckets exponentially up to
  MAX / limit and half linearly beyond. Prompt filtering as above plus length ≤ max_model_len; decode buckets per batch every block count
  from the batch up to the first at or above batch × ceil(max_model_len / block_size) (capped at the cache).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Mapping

STRATEGIES = ("exponential", "linear")
PHASE_DIMS = {"prompt": ("bs", "seq"), "decode": ("bs", "block")}
PARAMS = ("min", "step", "max")
LONG_CONTEXT = 8192  # exponential prompt lengths from this max_model_len on: half exponential, half linear
MAX_VALUE = 1 << 24  # a bucket bound past this is not a serving setting
MAX_GRAPHS = 20_000  # a grid past this many buckets would warm for days; refused before it is built


class BucketSettingError(ValueError):
    """Bucket settings that contradict each other or are not integers (one line naming the variable)."""


@dataclass(frozen=True)
class Engine:
    """The vLLM engine arguments that shape the grid and the memory plan (vLLM's defaults)."""

    max_model_len: int
    block_size: int = 128
    max_num_seqs: int = 256
    max_num_prefill_seqs: int | None = None  # None: max_num_seqs
    max_num_batched_tokens: int | None = None  # None: max(max_model_len, 2048), vLLM's without chunked prefill
    gpu_memory_utilization: float = 0.9
    graph_reserved_mem: float = 0.1  # VLLM_GRAPH_RESERVED_MEM: the share of usable memory kept for graphs
    contiguous_pa: bool = False

    @property
    def prefill_seqs(self) -> int:
        return self.max_num_prefill_seqs or self.max_num_seqs

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or max(self.max_model_len, 2048)

    def blocks_per_seq(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@dataclass(frozen=True)
class Grid:
    """The buckets to warm: prompt (batch, length) and decode (batch, blocks), and the settings behind them."""

    strategy: str
    prompt: tuple[tuple[int, int], ...]
    decode: tuple[tuple[int, int], ...]
    ranges: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "prompt_bs" -> (min, step, max[, limit])
    env: dict[str, str] = field(default_factory=dict)  # the variables that select it
    ignored: tuple[str, ...] = ()  # variables set but overridden (exponential)
    omitted: int = 0  # prompt pairs dropped by the token budget

    @property
    def graphs(self) -> int:
        return len(self.prompt) + len(self.decode)

    def prompt_bucket(self, batch: int, length: int) -> tuple[int, int]:
        """The shape a prompt batch runs at: each dimension padded to the smallest bucket value at or above it,
        or left unpadded past the largest (vLLM-Gaudi pads each dimension on its own)."""
        return (_pad([b for b, _ in self.prompt], batch), _pad([s for _, s in self.prompt], length))

    def decode_bucket(self, batch: int, blocks: int, cache_blocks: int) -> tuple[int, int]:
        """The shape a decode batch runs at: padded as a prompt batch is, the blocks capped at the cache's."""
        return (_pad([b for b, _ in self.decode], batch),
                min(_pad([k for _, k in self.decode], blocks), max(cache_blocks, blocks)))

    def warmed(self, phase: str, shape: tuple[int, int]) -> bool:
        return shape in (self.prompt_set if phase == "prompt" else self.decode_set)

    @property
    def prompt_set(self) -> frozenset:
        return frozenset(self.prompt)

    @property
    def decode_set(self) -> frozenset:
        return frozenset(self.decode)


def _pad(values: list[int], value: int) -> int:
    return min((v for v in values if v >= value), default=value)


# -- ranges ---------------------------------------------------------------------------------------------------

def read_range(env: Mapping[str, str], phase: str, dim: str, **defaults: int) -> tuple[int, int, int]:
    """(min, step, max) from ``VLLM_{PHASE}_{DIM}_BUCKET_{MIN,STEP,MAX}`` over the defaults, checked."""
    values = []
    for p in PARAMS:
        name = var(phase, dim, p)
        raw = env.get(name)
        values.append(defaults[p] if raw is None else _int(name, raw))
    lo, step, hi = values
    if step < 1:
        raise BucketSettingError(f"{var(phase, dim, 'step')}={step}: expected a positive integer")
    if lo < 1 or hi < 1:
        raise BucketSettingError(f"{var(phase, dim, 'min' if lo < 1 else 'max')}={lo if lo < 1 else hi}: expected "
                                 f"a positive integer")
    if lo > hi:
        raise BucketSettingError(f"{var(phase, dim, 'min')}={lo} is above {var(phase, dim, 'max')}={hi}: "
                                 "MIN must be at most MAX")
    if hi // step > MAX_GRAPHS:
        raise BucketSettingError(f"{var(phase, dim, 'step')}={step} with {var(phase, dim, 'max')}={hi}: "
                                 f"{hi // step:,} buckets; at most {MAX_GRAPHS:,} (raise STEP or lower MAX)")
    return lo, step, hi


def var(phase: str, dim: str, param: str) -> str:
    return f"VLLM_{phase}_{dim}_BUCKET_{param}".upper()


def _int(name: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BucketSettingError(f"{name}={raw!r}: expected an integer") from None
    if not -MAX_VALUE <= value <= MAX_VALUE:
        raise BucketSettingError(f"{name}={value}: expected an integer from 1 to {MAX_VALUE:,}")
    return value


def linear_range(lo: int, step: int, hi: int) -> list[int]:
    """MIN doubled while below STEP (and within MAX), then every multiple of STEP up to MAX; values below MIN
    dropped (vLLM-Gaudi's ``warmup_range``)."""
    ramp = itertools.takewhile(lambda x: x < step and x <= hi, (lo << i for i in itertools.count()))
    return [b for b in [*ramp, *range(step, hi + 1, step)] if b >= lo]


def exponential_range(lo: int, step: int, hi: int, limit: int, long_context: bool = False,
                      contiguous_pa: bool = False) -> list[int]:
    """``limit`` values from MIN to MAX spaced exponentially, rounded up to STEP, duplicates dropped; with
    ``long_context`` half of them exponential up to MAX / limit and the rest linear beyond
    (vLLM-Gaudi's ``warmup_range_with_limit``)."""
    if limit < 1:
        raise BucketSettingError(f"bucket limit {limit}: expected a positive integer")
    if limit == 1:
        return [hi]
    n_exp, first = (limit // 2, hi / limit) if long_context else (limit, hi)
    out = set()
    for i in range(n_exp):
        value = lo * math.pow(first / lo, (1.0 / (n_exp - 1)) * i) if n_exp > 1 else lo
        out.add(hi if i == limit - 1 and contiguous_pa else math.ceil(value / step) * step)
    if long_context:
        n_lin = limit - n_exp
        part = (hi - first) / n_lin
        for i in range(1, n_lin + 1):
            value = first + i * part
            out.add(hi if i == limit and contiguous_pa else math.ceil(value / step) * step)
    return sorted(out)


# -- grids ----------------------------------------------------------------------------------------------------

def strategy_of(env: Mapping[str, str]) -> str:
    """``VLLM_BUCKETING_STRATEGY`` (exp | lin), overridden by the older ``VLLM_EXPONENTIAL_BUCKETING``."""
    legacy = env.get("VLLM_EXPONENTIAL_BUCKETING")
    if legacy is not None:
        if legacy.strip().lower() not in ("true", "false", "1", "0"):
            raise BucketSettingError(f"VLLM_EXPONENTIAL_BUCKETING={legacy!r}: expected true or false")
        return "exponential" if legacy.strip().lower() in ("true", "1") else "linear"
    chosen = env.get("VLLM_BUCKETING_STRATEGY", "exp").strip().lower()
    names = {"exp": "exponential", "exponential": "exponential", "lin": "linear", "linear": "linear"}
    if chosen not in names:
        raise BucketSettingError(f"VLLM_BUCKETING_STRATEGY={chosen!r}: expected exp or lin")
    return names[chosen]


def bucket_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that shape the grid."""
    return {k: str(v) for k, v in env.items() if k.startswith("VLLM_") and ("_BUCKET" in k or k in (
        "VLLM_BUCKETING_STRATEGY", "VLLM_EXPONENTIAL_BUCKETING"))}


def generate(engine: Engine, cache_blocks: int | None, env: Mapping[str, str] | None = None) -> Grid:
    """The grid vLLM-Gaudi warms for ``engine`` with a KV cache of ``cache_blocks`` blocks under ``env``
    (None: the prompt buckets only, which do not depend on the cache)."""
    env = bucket_env(env or {})
    strategy = strategy_of(env)
    if strategy == "linear":
        return _linear(engine, cache_blocks, env)
    return _exponential(engine, cache_blocks, env)


def validate(engine: Engine, env: Mapping[str, str]) -> None:
    """BucketSettingError for a variable that is not an integer or contradicts another (before any work): the
    set ones are read over placeholder defaults, so that only what the user gave is judged."""
    env = bucket_env(env)
    if strategy_of(env) != "linear":
        return
    for phase, dims in PHASE_DIMS.items():
        for dim in dims:
            given = {p: _int(var(phase, dim, p), env[var(phase, dim, p)]) for p in PARAMS if var(phase, dim, p) in env}
            lo, hi = given.get("min", 1), given.get("max", max(1, given.get("min", 1)))
            read_range(env, phase, dim, min=lo, step=1, max=hi)


def _linear(e: Engine, cache_blocks: int, env: dict[str, str]) -> Grid:
    pbs = read_range(env, "prompt", "bs", min=1, step=32, max=e.prefill_seqs)
    pseq = read_range(env, "prompt", "seq", min=e.block_size, step=e.block_size, max=e.max_model_len)
    dbs = read_range(env, "decode", "bs", min=1, step=32, max=e.max_num_seqs)
    prompt, omitted = _filter_prompt(linear_range(*pbs), linear_range(*pseq), e.batched_tokens, None)
    if cache_blocks is None:
        return Grid("linear", tuple(prompt), (), {"prompt_bs": pbs, "prompt_seq": pseq}, env, (), omitted)
    block_max = cache_blocks if e.contiguous_pa and var("decode", "block", "max") not in env else None
    dblk = read_range(env, "decode", "block", min=e.block_size, step=e.block_size, max=block_max or cache_blocks)
    blocks = linear_range(*dblk)
    if len(blocks) * len(linear_range(*dbs)) > MAX_GRAPHS:
        raise BucketSettingError(f"decode: {len(linear_range(*dbs))} batch sizes x {len(blocks)} block counts; at most "
                                 f"{MAX_GRAPHS:,} buckets (raise VLLM_DECODE_BLOCK_BUCKET_STEP)")
    if block_max and cache_blocks not in blocks:
        blocks.append(cache_blocks)
    decode = []
    for bs in linear_range(*dbs):
        for k in blocks:
            if bs > k:
                continue  # more sequences than blocks cannot occur
            if k >= cache_blocks:
                decode.append((bs, cache_blocks))
                break
            decode.append((bs, k))
    ranges = {"prompt_bs": pbs, "prompt_seq": pseq, "decode_bs": dbs, "decode_block": dblk}
    return Grid("linear", tuple(prompt), tuple(_sorted(decode)), ranges, env, (), omitted)


def _exponential(e: Engine, cache_blocks: int, env: dict[str, str]) -> Grid:
    bs_limit = math.ceil(math.log2(e.prefill_seqs)) + 1
    seq_limit = math.ceil(math.log2(e.max_model_len)) + 1
    pbs, pseq = (1, 2, e.prefill_seqs, bs_limit), (e.block_size, e.block_size, e.max_model_len, seq_limit)
    long_context = e.max_model_len >= LONG_CONTEXT  # half the length buckets linear past MAX / limit
    prompt, omitted = _filter_prompt(exponential_range(*pbs), exponential_range(*pseq, long_context=long_context),
                                     e.batched_tokens, e.max_model_len)
    if cache_blocks is None:
        return Grid("exponential", tuple(prompt), (), {"prompt_bs": pbs, "prompt_seq": pseq}, env, (), omitted)
    dbs = (1, 2, e.max_num_seqs, math.ceil(math.log2(e.max_num_seqs)) + 1)
    top = cache_blocks if e.contiguous_pa else min(e.max_model_len // e.block_size * e.max_num_seqs, cache_blocks)
    dblk = (1, e.max_num_seqs, top, math.ceil(math.log2(max(cache_blocks, 2))) + 1)
    blocks = exponential_range(*dblk, contiguous_pa=e.contiguous_pa)
    decode = []
    for bs in exponential_range(*dbs, contiguous_pa=e.contiguous_pa):
        most = min(bs * e.blocks_per_seq(e.max_model_len), cache_blocks)
        upper = max((k for k in blocks if k <= most), default=None)
        if upper is not None:
            decode += [(bs, k) for k in blocks if bs <= k <= upper]
    ranges = {"prompt_bs": pbs, "prompt_seq": pseq, "decode_bs": dbs, "decode_block": dblk}
    ignored = tuple(sorted(k for k in env if k.endswith(("_MIN", "_STEP", "_MAX", "_LIMIT"))))
    return Grid("exponential", tuple(prompt), tuple(_sorted(decode)), ranges, env, ignored, omitted)


def _filter_prompt(batches: list[int], lengths: list[int], tokens: int, max_len: int | None
                   ) -> tuple[list[tuple[int, int]], int]:
    """The (batch, length) pairs within the token budget (and max_model_len), sorted as vLLM-Gaudi sorts
    them; every pair when none fits (vLLM-Gaudi then ignores the budget, warning of out-of-memory)."""
    pairs = list(itertools.product(batches, lengths))
    kept = [(b, s) for b, s in pairs if b * s <= tokens and (max_len is None or s <= max_len)]
    if not kept:
        return _sorted(pairs), 0
    return _sorted(kept), len(pairs) - len(kept)


def _sorted(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(set(pairs), key=lambda b: (b[0] * b[1], b[1], b[0]))


def settings_env(grid_ranges: Mapping[str, tuple[int, int, int]]) -> dict[str, str]:
    """The linear-strategy variables that produce ``grid_ranges`` ("prompt_bs" -> (min, step, max) ...)."""
    env = {"VLLM_BUCKETING_STRATEGY": "lin"}
    for key, values in grid_ranges.items():
        phase, dim = key.split("_")
        env.update({var(phase, dim, p): str(v) for p, v in zip(PARAMS, values)})
    return env


__all__ = ["BucketSettingError", "Engine", "Grid", "STRATEGIES", "bucket_env", "exponential_range", "generate",
           "linear_range", "read_range", "settings_env", "strategy_of", "var"]
