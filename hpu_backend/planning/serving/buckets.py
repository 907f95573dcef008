"""vLLM-Gaudi's bucket grid, as its plugin generates it, from the same engine arguments and environment variables;
and the lookup that maps a batch onto it (torch-free).

Follows vllm-project/vllm-gaudi ``vllm_gaudi/extension/bucketing`` at the release named by ``Engine.release``
(``RELEASES``; the default is the newest read). Prompt buckets are ``(batch, query tokens, context blocks)``,
decode buckets ``(batch, 1, blocks)``, exactly as the plugin lists them in its "Generated N prompt buckets" log:

- per dimension a range of values (``ranges.py``) from the strategy (``VLLM_BUCKETING_STRATEGY``: exp, the
  default, lin or pad; the older ``VLLM_EXPONENTIAL_BUCKETING`` overrides it with exp or lin) and its settings:
  exp derives them from the engine (``VLLM_PROMPT_QUERY_BUCKET_MIN=1`` is the one it reads), lin and pad read
  ``VLLM_{PROMPT,DECODE}_{BS,QUERY,CTX,BLOCK}_BUCKET_{MIN,STEP,MAX}`` (pad also ``_PAD_MAX``, ``_PAD_PERCENT``;
  the older ``VLLM_PROMPT_SEQ_BUCKET_*`` stand in for an unset QUERY one), or a bucket file
  (``VLLM_BUCKETING_FROM_FILE``, ``bucketfile.py``) lists them;
- prompt buckets are every (batch, query, context) whose query is within max_model_len, whose context blocks
  leave a query token (at most ceil((max_model_len - 1) / block_size)) and whose batch × query fits
  max_num_batched_tokens; from max_model_len 8192 on, the largest context value is replaced per query by the
  most context that query leaves room for (below ``VLLM_PROMPT_CTX_BUCKET_MAX`` when set);
- decode buckets are every (batch, blocks); without contiguous paged attention a batch needs as many blocks as
  sequences and its blocks are capped at batch × ceil(max_model_len / block_size); with it the cache's block
  count is always a bucket. Contiguous PA (``VLLM_CONTIGUOUS_PA``) is on exactly when prefix caching is off;
- max_num_prefill_seqs is the model runner's: ``VLLM_PROMPT_BS_BUCKET_MAX``, else 1.

Not modelled: merged prefill, speculative decoding's extra buckets, sliding-window slicing, mamba chunks, and
the hybrid models (GDN, mamba, interleaved sliding window) that skip the decode clamp.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from . import bucketfile, ranges
from ...errors import HpuBackendError

Bucket = tuple[int, int, int]


@dataclass(frozen=True)
class Release:
    """A vllm-gaudi commit, and the later changes to its grid that it lacks (by vllm-gaudi PR number):

    - 762: ``VLLM_BUCKETING_STRATEGY`` and the pad strategy (before, ``VLLM_EXPONENTIAL_BUCKETING`` alone chose exp
      or lin);
    - 795: an exponential range's last value lowered to its MAX (before, it could pass MAX);
    - 818: exponential decode blocks past the cache without contiguous PA (before, capped at the cache's blocks,
      max_model_len // block_size a sequence, with ceil(log2(blocks)) + 1 values);
    - 915: long-context prompt buckets only from max_model_len 8192 on, over plain exponential ranges (before, at
      every length, the exponential prompt context range stops where max_num_batched_tokens still fits and the
      largest context is set per query whatever ``VLLM_PROMPT_CTX_BUCKET_MAX`` says; from 8192 on, the exponential
      prompt ranges are half exponential up to MAX / limit, then linear up to MAX);
    - 1122: linear decode blocks capped at the cache only with contiguous PA (before, always);
    - 1362: a prompt bucket's context counted in blocks, at most ceil((max_model_len - 1) / block_size) (before,
      query + context × block_size within max_model_len);
    - 1700: non-contiguous exponential decode blocks capped at 3x the cache's blocks."""

    name: str
    commit: str
    date: str
    lacks: frozenset[int] = frozenset()

    def has(self, pr: int) -> bool:
        return pr not in self.lacks


RELEASES = {
    "main": Release("main@091bbad (v0.27.0rc0+51)", "091bbadda10bee4fd3f6d0efc1844d2610dd2707", "2026-08-21"),
    "v0.27.0rc0": Release("v0.27.0rc0", "d01a3caecd8d818c29c06af56591e40eb4e3dcca", "2026-08-04", frozenset({1700})),
    # main as PR #762 (the pad strategy) counted it: between #739 and #795, in no tag (v0.13.0 is older)
    "main@c799e57": Release("main@c799e57 (2026-01-02)", "c799e5775742c06232b3bba44e793456fe5185cb", "2026-01-02",
                            frozenset({762, 795, 818, 915, 1122, 1362, 1700})),
}
STRATEGIES = {"exp": "exponential", "lin": "linear", "pad": "padding_aware"}
LONG_CONTEXT = 8192  # from this max_model_len on, the largest prompt context is set per query
MAX_VALUE = 1 << 24  # a bucket setting past this is not a serving setting
MAX_GRAPHS = 100_000  # a grid past this many buckets would warm for weeks; refused
MAX_CANDIDATES = 4_000_000  # the combinations filtered into a grid; past this, refused before they are built
DEFAULT_BATCHED_TOKENS = 2048  # vllm serve's default on HPU (vLLM's batch defaults for a device without memory)
SETTING_VARS = ("VLLM_BUCKETING_STRATEGY", "VLLM_EXPONENTIAL_BUCKETING", "VLLM_BUCKETING_FROM_FILE",
                "VLLM_CONTIGUOUS_PA")


class BucketSettingError(HpuBackendError, ValueError):
    """Bucket settings that contradict each other or are not integers (one line naming the variable)."""


@dataclass(frozen=True)
class Engine:
    """The vLLM engine arguments that shape the grid and the memory plan (vLLM's defaults)."""

    max_model_len: int
    block_size: int = 128
    max_num_seqs: int = 256
    max_num_prefill_seqs: int | None = None  # None: VLLM_PROMPT_BS_BUCKET_MAX, else 1 (vLLM-Gaudi's model runner)
    max_num_batched_tokens: int | None = None  # None: DEFAULT_BATCHED_TOKENS
    gpu_memory_utilization: float = 0.9
    graph_reserved_mem: float = 0.1  # VLLM_GRAPH_RESERVED_MEM: the share of usable memory kept for graphs
    contiguous_pa: bool | None = None  # VLLM_CONTIGUOUS_PA; None: on exactly when prefix caching is off
    enable_prefix_caching: bool = True  # vLLM V1's default
    num_gpu_blocks_override: int | None = None
    release: str = "main"

    @property
    def prefill_seqs(self) -> int:
        return self.max_num_prefill_seqs or 1

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS

    @property
    def contiguous(self) -> bool:
        return (not self.enable_prefix_caching) if self.contiguous_pa is None else self.contiguous_pa

    def blocks_per_seq(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


def resolve(engine: Engine, env: Mapping[str, str]) -> Engine:
    """The engine with what vLLM-Gaudi reads from the environment filled in: max_num_prefill_seqs from
    ``VLLM_PROMPT_BS_BUCKET_MAX`` (else 1) and contiguous PA from ``VLLM_CONTIGUOUS_PA``."""
    prefill = engine.max_num_prefill_seqs
    if prefill is None:
        raw = env.get("VLLM_PROMPT_BS_BUCKET_MAX")
        prefill = 1 if raw is None else _int("VLLM_PROMPT_BS_BUCKET_MAX", raw, low=1)
    contiguous = engine.contiguous_pa
    if contiguous is None and env.get("VLLM_CONTIGUOUS_PA") is not None:
        contiguous = _boolean(env["VLLM_CONTIGUOUS_PA"])
    return replace(engine, max_num_prefill_seqs=prefill, contiguous_pa=contiguous)


@dataclass(frozen=True)
class Grid:
    """The buckets vLLM-Gaudi warms, the settings behind them, and its lookup of a batch's bucket."""

    strategy: str
    prompt: tuple[Bucket, ...]
    decode: tuple[Bucket, ...]
    engine: Engine | None = None
    cache_blocks: int | None = None
    ranges: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "prompt_bs" -> the logged cfg
    values: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "prompt_bs" -> its values
    env: dict[str, str] = field(default_factory=dict)  # the variables read
    ignored: tuple[str, ...] = ()  # variables set but overwritten (exponential)
    omitted: dict[str, int] = field(default_factory=dict)  # candidate buckets the filters dropped, per phase
    skipped_lines: tuple[int, ...] = ()  # bucket-file lines vLLM-Gaudi skips

    @property
    def graphs(self) -> int:
        return len(self.prompt) + len(self.decode)

    @property
    def max_decode_blocks(self) -> int:
        return max((k for _, _, k in self.decode), default=0)

    def prompt_bucket(self, batch: int, query: int, ctx: int = 0) -> Bucket:
        """The bucket a prefill of ``batch`` sequences, ``query`` tokens and ``ctx`` context blocks runs at: the
        first listed bucket at least as large in every dimension, else vLLM-Gaudi's fallback (compiled then)."""
        return _closest(self.prompt, (batch, query, ctx)) or self._fallback(batch, query, ctx, True)

    def decode_bucket(self, batch: int, blocks: int) -> Bucket:
        """The bucket a decode of ``batch`` sequences holding ``blocks`` KV blocks runs at (blocks past the
        largest decode bucket are capped to it, as vLLM-Gaudi caps them)."""
        top = self.max_decode_blocks
        blocks = min(blocks, top) if top else blocks
        return _closest(self.decode, (batch, 1, blocks)) or self._fallback(batch, 1, blocks, False)

    def _fallback(self, batch: int, query: int, ctx: int, prompt: bool) -> Bucket:
        e = self.engine
        if e is None:
            return batch, query, ctx
        b = min(_fallback_value(batch, 2), e.max_num_seqs)
        q = min(_fallback_value(query, 32), e.batched_tokens)
        if self.cache_blocks is None:
            return b, q, 0
        c = _fallback_value(ctx, 32)
        if prompt:
            c = min(c, math.ceil((e.max_model_len - 1) / e.block_size))
        elif self.max_decode_blocks:
            c = min(c, self.max_decode_blocks)
        return b, q, c

    def warmed(self, phase: str, shape: Bucket) -> bool:
        return shape in (self._sets[0] if phase == "prompt" else self._sets[1])

    @property
    def _sets(self) -> tuple[frozenset, frozenset]:
        cached = self.__dict__.get("_cached_sets")
        if cached is None:
            cached = (frozenset(self.prompt), frozenset(self.decode))
            object.__setattr__(self, "_cached_sets", cached)  # a frozen dataclass's derived value, built once
        return cached


def _closest(buckets: tuple[Bucket, ...], target: Bucket) -> Bucket | None:
    """vLLM-Gaudi's lookup: from the target's place in the sorted list, the first bucket that covers it."""
    for bucket in itertools.islice(buckets, bisect.bisect_left(buckets, target), None):
        if bucket[0] >= target[0] and bucket[1] >= target[1] and bucket[2] >= target[2]:
            return bucket
    return None


def _fallback_value(n: int, base: int) -> int:
    """The next value for a shape no bucket covers: rounded up to a multiple of ceil(n^(1/3)) × base."""
    if n <= 1:
        return n
    size = math.ceil(math.pow(n, 1 / 3)) * base
    return math.ceil(n / size) * size


# -- settings ------------------------------------------------------------------------------------------------

def bucket_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that shape the grid."""
    return {k: str(v) for k, v in env.items() if k.startswith("VLLM_") and ("_BUCKET_" in k or k in SETTING_VARS)}


def strategy_of(env: Mapping[str, str], release: str = "main") -> str:
    """``VLLM_BUCKETING_STRATEGY`` (exp, lin or pad), overridden by the older ``VLLM_EXPONENTIAL_BUCKETING`` (the only
    switch of a release before PR #762, where the first is refused rather than silently ignored)."""
    rel = RELEASES[release]
    if not rel.has(762):
        if "VLLM_BUCKETING_STRATEGY" in env:
            raise BucketSettingError(f"VLLM_BUCKETING_STRATEGY: not read by vLLM-Gaudi {rel.name}; set "
                                     "VLLM_EXPONENTIAL_BUCKETING (true: exp, false: lin) instead")
        return "linear" if not _boolean(env.get("VLLM_EXPONENTIAL_BUCKETING", "true")) else "exponential"
    chosen = env.get("VLLM_BUCKETING_STRATEGY", "exp")
    if chosen not in STRATEGIES:
        raise BucketSettingError(f"VLLM_BUCKETING_STRATEGY={chosen!r}: expected exp, lin or pad")
    legacy = env.get("VLLM_EXPONENTIAL_BUCKETING")
    if legacy is not None:
        return "exponential" if _boolean(legacy) else "linear"
    return STRATEGIES[chosen]


def _boolean(raw: str) -> bool:
    """vLLM-Gaudi's reading of a flag: true, t, 1, yes, y or on (any case) is true, anything else false."""
    return str(raw).strip().lower() in ("true", "t", "1", "yes", "y", "on")


def var(phase: str, dim: str, param: str) -> str:
    return f"VLLM_{phase}_{dim}_BUCKET_{param}".upper()


def _int(name: str, raw: str, low: int = 0) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BucketSettingError(f"{name}={raw!r}: expected an integer") from None
    if not low <= value <= MAX_VALUE:
        raise BucketSettingError(f"{name}={value}: expected an integer from {low} to {MAX_VALUE:,}")
    return value


def read_dim(env: Mapping[str, str], phase: str, dim: str, **defaults: int) -> list[int]:
    """A dimension's settings from its variables over ``defaults`` (min, step, max[, pad_max, pad_percent]); an
    unset prompt QUERY variable takes the older SEQ one. Checked as vLLM-Gaudi's asserts check them."""
    values = []
    for param, default in defaults.items():
        name = var(phase, dim, param)
        raw = env.get(name)
        if raw is None and dim == "query":
            name = var(phase, "seq", param)
            raw = env.get(name)
        values.append(default if raw is None else _int(name, raw, low=1 if param == "step" else 0))
    lo, _, hi = values[:3]
    if lo > hi:
        raise BucketSettingError(f"{var(phase, dim, 'min')}={lo} is above {var(phase, dim, 'max')}={hi}: MIN must "
                                 "be at most MAX")
    if len(values) == 5 and values[4] > 50:
        raise BucketSettingError(f"{var(phase, dim, 'pad_percent')}={values[4]}: expected 0 to 50")
    return values


def validate(env: Mapping[str, str]) -> None:
    """BucketSettingError, before any work, for a bucket variable that is not an integer, a MIN above its MAX, a
    PAD_PERCENT past 50 or an unknown strategy (the decode ones are otherwise read only once the cache is known)."""
    env = bucket_env(env)
    strategy_of(env)
    for name, raw in env.items():
        if name.endswith(("_MIN", "_MAX", "_PAD_MAX", "_PAD_PERCENT")) and "_BUCKET_" in name:
            _int(name, raw)
        elif name.endswith("_STEP") and "_BUCKET_" in name:
            _int(name, raw, low=1)
        if name.endswith("_PAD_PERCENT") and _int(name, raw) > 50:
            raise BucketSettingError(f"{name}={raw}: expected 0 to 50")
        low = name[:-4] + "_MIN" if name.endswith("_BUCKET_MAX") else None
        if low in env and _int(low, env[low]) > _int(name, raw):
            raise BucketSettingError(f"{low}={env[low]} is above {name}={raw}: MIN must be at most MAX")


# -- the strategies' settings per dimension ------------------------------------------------------------------

def _exp_prompt(e: Engine, env: Mapping[str, str]) -> tuple[list[int], list[int], list[int]]:
    raw_min = env.get("VLLM_PROMPT_QUERY_BUCKET_MIN")  # exp reads this one variable: 1 serves P/D decode instances
    query_min = 1 if raw_min is not None and _int("VLLM_PROMPT_QUERY_BUCKET_MIN", raw_min) == 1 else e.block_size
    pf, tokens = e.prefill_seqs, e.batched_tokens
    per_query = e.max_model_len >= LONG_CONTEXT or not RELEASES[e.release].has(915)
    reserved = tokens if per_query else query_min  # the largest context is set per query later
    max_ctx = max(1, (e.max_model_len - reserved) // e.block_size)
    ctx_limit = 2 if max_ctx == 1 else math.ceil(math.log2(max_ctx)) + 1
    return ([1, 2, pf, math.ceil(math.log2(pf)) + 1], [query_min, e.block_size, tokens, math.ceil(math.log2(tokens))],
            [0, 1, max_ctx, ctx_limit])


def _exp_decode(e: Engine, blocks: int) -> tuple[list[int], list[int]]:
    bs = [1, 2, e.max_num_seqs, math.ceil(math.log2(e.max_num_seqs)) + 1]
    rel = RELEASES[e.release]
    if not rel.has(818):  # never past the cache
        top = blocks if e.contiguous else min(e.max_model_len // e.block_size * e.max_num_seqs, blocks)
        return bs, [1, e.max_num_seqs, top, math.ceil(math.log2(blocks)) + 1]
    worst = math.ceil(e.max_model_len / e.block_size) * e.max_num_seqs  # every sequence at max_model_len
    top = min(blocks, worst) if e.contiguous else (min(worst, 3 * blocks) if rel.has(1700) else worst)
    limit = math.ceil(math.log2(top)) + 1
    if not e.contiguous and blocks > 0 and top > 3 * blocks:  # denser buckets over a range past the cache
        limit += math.ceil(math.log2(top / (3 * blocks))) + 1
    return bs, [1, e.max_num_seqs, top, limit]


def _lin_prompt(e: Engine, env: Mapping[str, str]) -> tuple[list[int], list[int], list[int]]:
    bs = read_dim(env, "prompt", "bs", min=1, step=1, max=e.prefill_seqs)
    query = read_dim(env, "prompt", "query", min=e.block_size, step=e.block_size, max=e.batched_tokens)
    ctx = read_dim(env, "prompt", "ctx", min=0, step=1, max=(e.max_model_len - query[0]) // e.block_size)
    return bs, query, ctx


def _lin_decode(e: Engine, env: Mapping[str, str], blocks: int) -> tuple[list[int], list[int]]:
    bs = read_dim(env, "decode", "bs", min=1, step=32, max=e.max_num_seqs)
    top = blocks if e.contiguous else max(e.max_model_len * e.max_num_seqs // e.block_size, e.block_size)
    block = _read_unchecked(env, "decode", "block", [1, e.block_size, top])
    new = RELEASES[e.release].has(1122)  # before it, capped at the cache always, and MIN lowered only then
    capped = (e.contiguous or not new) and block[2] > blocks
    if capped:
        block[2] = blocks
    if block[0] > block[2] and (capped or new):
        block[0] = max(1, block[2] - block[1])
    return bs, _checked(block, "decode", "block")


def _pad_prompt(e: Engine, env: Mapping[str, str]) -> tuple[list[int], list[int], list[int]]:
    pf, tokens, size = e.prefill_seqs, e.batched_tokens, e.block_size
    bs = read_dim(env, "prompt", "bs", min=1, step=1, max=pf, pad_max=-(-pf // 4), pad_percent=25)
    query = read_dim(env, "prompt", "query", min=size, step=size, max=tokens, pad_max=-(-tokens // 4), pad_percent=25)
    max_ctx = math.ceil((e.max_model_len - query[0]) / size)
    ctx = read_dim(env, "prompt", "ctx", min=0, step=2, max=max_ctx, pad_max=-(-tokens // size), pad_percent=25)
    return bs, query, ctx


def _pad_decode(e: Engine, env: Mapping[str, str], blocks: int) -> tuple[list[int], list[int]]:
    seqs = e.max_num_seqs
    bs = read_dim(env, "decode", "bs", min=1, step=2, max=seqs, pad_max=-(-seqs // 4), pad_percent=25)
    top = blocks if e.contiguous else max(math.ceil(e.max_model_len * seqs / e.block_size), e.block_size)
    block = _read_unchecked(env, "decode", "block", [e.block_size, e.block_size, top, -(-top // 4), 25])
    if e.contiguous and block[2] > blocks:
        block[2] = blocks
    if block[0] > blocks:
        block[0] = max(1, blocks - block[1])
    return bs, _checked(block, "decode", "block")


def _read_unchecked(env: Mapping[str, str], phase: str, dim: str, defaults: list[int]) -> list[int]:
    """A dimension's settings before the corrections vLLM-Gaudi applies ahead of its checks (decode blocks)."""
    params = ("min", "step", "max", "pad_max", "pad_percent")[:len(defaults)]
    return [d if env.get(var(phase, dim, p)) is None else _int(var(phase, dim, p), env[var(phase, dim, p)],
                                                                 low=1 if p == "step" else 0)
            for p, d in zip(params, defaults)]


def _checked(cfg: list[int], phase: str, dim: str) -> list[int]:
    if cfg[0] > cfg[2]:
        raise BucketSettingError(f"{var(phase, dim, 'min')}={cfg[0]} is above {var(phase, dim, 'max')}={cfg[2]}: "
                                 "MIN must be at most MAX")
    if len(cfg) == 5 and cfg[4] > 50:
        raise BucketSettingError(f"{var(phase, dim, 'pad_percent')}={cfg[4]}: expected 0 to 50")
    return cfg


def _values(strategy: str, cfg: list[int], e: Engine, name: str) -> list[int]:
    if cfg[1] and (cfg[2] - cfg[0]) // cfg[1] > MAX_GRAPHS:
        raise BucketSettingError(f"{name}: {cfg[0]} to {cfg[2]} by {cfg[1]} is over {MAX_GRAPHS:,} buckets; raise "
                                 "its STEP or lower its MAX")
    if strategy == "exponential":
        rel = RELEASES[e.release]
        split = not rel.has(915) and name.startswith("prompt") and e.max_model_len >= LONG_CONTEXT
        return ranges.exponential(*cfg, contiguous_pa=e.contiguous, split=split, cap=rel.has(795))
    return sorted(ranges.linear(*cfg) if strategy == "linear" else ranges.padding_aware(*cfg))


# -- the grid ------------------------------------------------------------------------------------------------

EXP_OVERWRITTEN = tuple(var(p, d, x) for p, dims in (("prompt", ("bs", "seq")), ("decode", ("bs", "block")))
                        for d in dims for x in ("min", "step", "max"))


def generate(engine: Engine, cache_blocks: int | None, env: Mapping[str, str] | None = None) -> Grid:
    """The grid vLLM-Gaudi warms for ``engine`` with a KV cache of ``cache_blocks`` blocks under ``env``
    (None: the prompt buckets only, which do not depend on the cache)."""
    env = bucket_env(env or {})
    engine = resolve(engine, env)
    strategy = strategy_of(env, engine.release)
    if env.get("VLLM_BUCKETING_FROM_FILE"):
        return _from_file(engine, cache_blocks, env, strategy)
    cfg, values = {}, {}
    for key, dim_cfg in zip(("prompt_bs", "prompt_query", "prompt_ctx"), _prompt_cfgs(strategy, engine, env)):
        cfg[key], values[key] = dim_cfg, _values(strategy, dim_cfg, engine, key)
    _check_size("prompt", values["prompt_bs"], values["prompt_query"], values["prompt_ctx"])
    prompt, omitted = _prompt(engine, env, values["prompt_bs"], values["prompt_query"], values["prompt_ctx"])
    decode: list[Bucket] = []
    if cache_blocks is not None:
        for key, dim_cfg in zip(("decode_bs", "decode_block"), _decode_cfgs(strategy, engine, env, cache_blocks)):
            cfg[key], values[key] = dim_cfg, _values(strategy, dim_cfg, engine, key)
        if engine.contiguous and values["decode_block"][-1] < cache_blocks:
            values["decode_block"].append(cache_blocks)
        _check_size("decode", values["decode_bs"], values["decode_block"])
        decode, omitted["decode"] = _decode(engine, values["decode_bs"], values["decode_block"])
    ignored = ()
    if strategy == "exponential":  # the runner still takes max_num_prefill_seqs from VLLM_PROMPT_BS_BUCKET_MAX
        ignored = tuple(k for k in EXP_OVERWRITTEN if k in env and k != "VLLM_PROMPT_BS_BUCKET_MAX")
    return Grid(strategy, tuple(prompt), tuple(decode), engine, cache_blocks, {k: tuple(v) for k, v in cfg.items()},
                {k: tuple(v) for k, v in values.items()}, env, ignored, omitted)


def _prompt_cfgs(strategy: str, e: Engine, env: Mapping[str, str]):
    if strategy == "exponential":
        return _exp_prompt(e, env)
    return _lin_prompt(e, env) if strategy == "linear" else _pad_prompt(e, env)


def _decode_cfgs(strategy: str, e: Engine, env: Mapping[str, str], blocks: int):
    if strategy == "exponential":
        return _exp_decode(e, blocks)
    return _lin_decode(e, env, blocks) if strategy == "linear" else _pad_decode(e, env, blocks)


def _check_size(phase: str, *dims: list[int]) -> None:
    count = math.prod(len(d) for d in dims)
    if count > MAX_CANDIDATES:
        raise BucketSettingError(f"{phase}: {' x '.join(str(len(d)) for d in dims)} = {count:,} combinations of "
                                 f"bucket values, over {MAX_CANDIDATES:,}; raise the STEP of a {phase} dimension or "
                                 "lower its MAX")


def _check_count(phase: str, buckets: list[Bucket]) -> list[Bucket]:
    if len(buckets) > MAX_GRAPHS:
        raise BucketSettingError(f"{phase}: {len(buckets):,} buckets, over {MAX_GRAPHS:,} (weeks of warm-up); raise "
                                 f"the STEP of a {phase} dimension or lower its MAX")
    return buckets


def _prompt_ok(e: Engine, bs: int, query: int, ctx: int) -> bool:
    """vLLM-Gaudi's prompt filters: the query within max_model_len, the context leaving room for one query token
    (before PR #1362: query and context together within max_model_len), batch × query within the token budget."""
    if not RELEASES[e.release].has(1362):
        return query + ctx * e.block_size <= e.max_model_len and bs * query <= e.batched_tokens
    return (ctx <= math.ceil((e.max_model_len - 1) / e.block_size) and query <= e.max_model_len
            and bs * query <= e.batched_tokens)


def _prompt(e: Engine, env: Mapping[str, str], batches: list[int], queries: list[int], contexts: list[int]
            ) -> tuple[list[Bucket], dict[str, int]]:
    new = RELEASES[e.release].has(915)  # before it: at every length, whatever VLLM_PROMPT_CTX_BUCKET_MAX says
    ctx_cap = env.get("VLLM_PROMPT_CTX_BUCKET_MAX") if new else None
    ctx_cap = None if ctx_cap is None else _int("VLLM_PROMPT_CTX_BUCKET_MAX", ctx_cap)
    top, edge = max(contexts), e.max_model_len >= LONG_CONTEXT or not new
    out, dropped = set(), set()
    for bs, first_ctx in itertools.product(batches, contexts):
        ctx = first_ctx  # kept from one query to the next, as vLLM-Gaudi's loop keeps it
        for query in queries:
            if edge and first_ctx == top:  # the most context this query leaves room for
                room = (e.max_model_len - query) // e.block_size
                if room >= 0 and (ctx_cap is None or room < ctx_cap):
                    ctx = room
            (out if _prompt_ok(e, bs, query, ctx) else dropped).add((bs, query, ctx))
    if not out:
        raise BucketSettingError(f"no prompt bucket fits: every batch x query is over --max-num-batched-tokens "
                                 f"{e.batched_tokens} or past --max-model-len {e.max_model_len}; raise "
                                 "--max-num-batched-tokens or lower the prompt MIN settings")
    return _check_count("prompt", sorted(out)), {"prompt": len(dropped - out)}


def _decode(e: Engine, batches: list[int], blocks: list[int]) -> tuple[list[Bucket], int]:
    """Every (batch, 1, blocks); without contiguous PA a batch has at least a block a sequence and at most
    max_model_len's blocks a sequence."""
    if e.contiguous:
        return _check_count("decode", sorted({(bs, 1, k) for bs in batches for k in blocks})), 0
    per_seq = math.ceil(e.max_model_len / e.block_size)
    kept = {(bs, 1, min(k, bs * per_seq)) for bs in batches for k in blocks if bs <= k}
    if not kept:
        raise BucketSettingError("no decode bucket fits: every batch size is above every block count; lower "
                                 "VLLM_DECODE_BS_BUCKET_MIN or raise VLLM_DECODE_BLOCK_BUCKET_MIN")
    return _check_count("decode", sorted(kept)), sum(bs > k for bs in batches for k in blocks)


def _from_file(e: Engine, cache_blocks: int | None, env: Mapping[str, str], strategy: str) -> Grid:
    """The buckets a bucket file lists, through the same filters as generated ones."""
    try:
        listed = bucketfile.read(env["VLLM_BUCKETING_FROM_FILE"])
    except bucketfile.BucketFileError as err:
        raise BucketSettingError(str(err)) from None
    prompt = sorted({b for b in listed.prompt if _prompt_ok(e, *b)})
    if not prompt:
        raise BucketSettingError(f"VLLM_BUCKETING_FROM_FILE={env['VLLM_BUCKETING_FROM_FILE']}: no prompt bucket "
                                 "within --max-num-batched-tokens and --max-model-len")
    omitted = {"prompt": len(listed.prompt) - len(prompt)}
    decode: list[Bucket] = []
    if cache_blocks is not None:
        per_seq = math.ceil(e.max_model_len / e.block_size)
        decode = sorted({b if e.contiguous else (b[0], 1, min(b[2], b[0] * per_seq)) for b in listed.decode
                         if e.contiguous or b[0] <= b[2]})
        if not decode:
            raise BucketSettingError(f"VLLM_BUCKETING_FROM_FILE={env['VLLM_BUCKETING_FROM_FILE']}: no decode "
                                     "bucket with at least as many blocks as sequences")
        omitted["decode"] = len(listed.decode) - len(decode)
    return Grid("file", tuple(prompt), tuple(decode), e, cache_blocks, env=env, omitted=omitted,
                skipped_lines=listed.skipped)


def settings_env(grid_ranges: Mapping[str, tuple[int, int, int]], release: str = "main") -> dict[str, str]:
    """The linear-strategy variables that produce ``grid_ranges`` ("prompt_query" -> (min, step, max) ...), with
    prompt context 0 only (a replayed trace has no prefix-cache hits), for vLLM-Gaudi ``release``."""
    switch = ({"VLLM_BUCKETING_STRATEGY": "lin"} if RELEASES[release].has(762)
              else {"VLLM_EXPONENTIAL_BUCKETING": "false"})  # the only switch before PR #762
    env = {**switch, "VLLM_PROMPT_CTX_BUCKET_MIN": "0", "VLLM_PROMPT_CTX_BUCKET_STEP": "1",
           "VLLM_PROMPT_CTX_BUCKET_MAX": "0"}
    for key, values in grid_ranges.items():
        phase, dim = key.split("_")
        env.update({var(phase, dim, p): str(v) for p, v in zip(("min", "step", "max"), values)})
    return env


__all__ = ["BucketSettingError", "Engine", "Grid", "RELEASES", "Release", "STRATEGIES", "bucket_env", "generate",
           "read_dim", "resolve", "settings_env", "strategy_of", "validate", "var"]
