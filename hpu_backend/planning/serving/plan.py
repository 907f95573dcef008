"""The serving plan: for a model on ``cards`` cards of ``target``, vLLM-Gaudi's bucket grid (``buckets.py``, the
plugin release it follows named in the plan), the memory it leaves for the KV cache, every warm-up step checked
against the memory it has, warm-up time cold and from a recipe cache, and (given a trace) continuous batching
over it, the recompiles it would cause and the bucket settings that fit it best within a warm-up budget; a
JSON-ready dict.

Memory follows vLLM-Gaudi's start-up (``hpu_worker.determine_available_memory``): weights are loaded; the profiling
run is initialize-only in the releases followed, so the memory then free is what the weights leave;
``gpu_memory_utilization`` of it is usable, of which ``VLLM_GRAPH_RESERVED_MEM`` is kept for graphs and the rest,
less one block, becomes KV-cache blocks of ``block_size`` tokens (``--num-gpu-blocks-override`` replaces the
count). Warm-up then runs the prompt buckets and the decode buckets, each phase largest first, with what the KV
cache left: a step fits when its activations and the graphs compiled before it (``GRAPH_BYTES`` each, Intel's
autocalc figure) fit that room. A decode step's activations hold one layer's keys and values over every KV block
the bucket references (flat paged attention gathers them, ``model.py``), so a decode bucket referencing more
blocks than the cache has still costs its full size. The first step that does not fit is named with the setting
to change.

Warm-up compiles and runs every bucket once. Compiling a bucket is two stages (vLLM-Gaudi's managing_warm-up.md):
the graph compiler's, ``COMPILE_S_PER_SLICE`` per unit of its work (``model.py``: the nodes of the distinct graphs
it compiles × on-chip slices), which a recipe cache skips, and the bridge's HPU graph build, ``GRAPH_S_PER_NODE``
per node, which runs from a recipe cache too. Both factors are fitted on the one calibration row
(bench/serving_bench.py) and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ...diagnosis.analyze import hbm_bytes
from ..capacity import CapacityError
from . import autocalc
from . import buckets as bk
from .model import ServingModel
from .simulate import Costs, replay
from .trace import Request

# Fitted by bench/serving_bench.py on vLLM-Gaudi's managing_warm-up.md row: LLaMA 3.1 8B, TP 1, bf16, the bucket
# settings that page gives (47 graphs), max-model-len 8192: 66 s cold, 23 s from a recipe cache. Planned on gaudi2.
COMPILE_S_PER_SLICE = 1.797e-4
GRAPH_S_PER_NODE = 1.146e-4
CALIBRATION = "vLLM-Gaudi docs, managing_warm-up.md: LLaMA 3.1 8B TP1 bf16, 66 s cold / 23 s cached"
GRAPH_BYTES = 10 << 20  # device memory a compiled graph keeps: vllm-gaudi's autocalc, APPROX_MEM_PER_GRAPH_MB


class PlanError(CapacityError):
    """A deployment that cannot be planned: a model too big for the cards, a KV cache that cannot hold one
    sequence, a max_model_len past the model's context (one line naming the field and its valid range)."""


@dataclass(frozen=True)
class Memory:
    hbm: int
    weights: int
    usable: int
    graph_reserved: int
    kv_bytes: int
    block_bytes: int
    blocks: int
    overridden: bool = False  # --num-gpu-blocks-override set the block count

    @property
    def warmup_room(self) -> int:
        """What the weights and the KV cache leave for warm-up: activations and compiled graphs."""
        return self.hbm - self.weights - self.kv_bytes

    def to_dict(self) -> dict[str, int]:
        return {"hbm_bytes": self.hbm, "weights_bytes": self.weights, "usable_bytes": self.usable,
                "graph_reserved_bytes": self.graph_reserved, "kv_cache_bytes": self.kv_bytes,
                "block_bytes": self.block_bytes, "kv_blocks": self.blocks, "warmup_room_bytes": self.warmup_room,
                "num_gpu_blocks_override": self.overridden}


def check_engine(engine: bk.Engine, context: int | None) -> None:
    """PlanError for engine arguments out of range (before any work)."""
    if context is not None and engine.max_model_len > context:
        raise PlanError(f"--max-model-len {engine.max_model_len}: past the model's context length {context} "
                        f"(config); expected 1 to {context}")
    if not 0 < engine.gpu_memory_utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization {engine.gpu_memory_utilization}: expected above 0, at most 1")
    if not 0 <= engine.graph_reserved_mem < 1:
        raise PlanError(f"VLLM_GRAPH_RESERVED_MEM={engine.graph_reserved_mem}: expected 0 or more, below 1")
    if engine.release not in bk.RELEASES:
        raise PlanError(f"--vllm-gaudi {engine.release!r}: expected {' or '.join(bk.RELEASES)}")


def memory(model: ServingModel, engine: bk.Engine) -> Memory:
    """The KV-cache blocks vLLM-Gaudi allocates after the weights (PlanError when none fit one sequence)."""
    hbm = hbm_bytes(model.target)
    _check_weights(model.name, model.weights_bytes, model.target, model.cards)
    usable = int((hbm - model.weights_bytes) * engine.gpu_memory_utilization)
    reserved = int(usable * engine.graph_reserved_mem)
    block = max(1, round(model.kv_bytes_per_token * engine.block_size))
    override = engine.num_gpu_blocks_override
    blocks = override if override else max(0, usable - reserved - block) // block  # one block kept for the dummy
    need = engine.blocks_per_seq(engine.max_model_len)
    if blocks < need:
        raise PlanError(f"KV cache: {blocks} blocks of {engine.block_size} tokens fit after the weights, fewer than "
                        f"the {need} one sequence of --max-model-len {engine.max_model_len} needs; raise "
                        f"--gpu-memory-utilization (at most 1), add --cards or lower --max-model-len")
    return Memory(hbm, model.weights_bytes, usable, reserved, blocks * block, block, blocks, bool(override))


def check_fits(name: str, target: str, cards: int, weights_bytes: int, kv_bytes_per_token: float,
               engine: bk.Engine) -> None:
    """PlanError, from the config alone and before any lowering, when the weights fill a card or the memory they
    leave cannot hold one sequence's KV cache (``memory`` checks again, exactly, after lowering)."""
    _check_weights(name, weights_bytes, target, cards)
    room = int((hbm_bytes(target) - weights_bytes) * engine.gpu_memory_utilization * (1 - engine.graph_reserved_mem))
    blocks = engine.blocks_per_seq(engine.max_model_len)
    need = blocks * engine.block_size * kv_bytes_per_token
    if need > room:
        raise PlanError(f"KV cache: one sequence of --max-model-len {engine.max_model_len} needs {_gib(need)} "
                        f"({blocks} blocks of {engine.block_size} tokens, {kv_bytes_per_token:,.0f} bytes a token), "
                        f"more than the {_gib(room)} the weights leave at --gpu-memory-utilization "
                        f"{engine.gpu_memory_utilization:g}; lower --max-model-len or add --cards")


def _check_weights(name: str, weights_bytes: int, target: str, cards: int) -> None:
    hbm = hbm_bytes(target)
    if weights_bytes >= hbm:
        raise PlanError(f"{name}: weights take {_gib(weights_bytes)} per card, past the {_gib(hbm)} of a "
                        f"{target} card with --cards {cards}; use more --cards (up to 8) or --dtype fp8")


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


# -- buckets: time, memory, warm-up -----------------------------------------------------------------------------

PHASES = ("prompt", "decode")


def bucket_rows(model: ServingModel, grid: bk.Grid, engine: bk.Engine) -> list[dict[str, Any]]:
    """One row per bucket, in vLLM-Gaudi's warm-up order (prompt then decode, each largest first)."""
    rows = []
    for phase in PHASES:
        for bucket in reversed(grid.prompt if phase == "prompt" else grid.decode):
            rows.append(_row(model, phase, bucket, engine))
    return rows


def _row(model: ServingModel, phase: str, bucket: bk.Bucket, engine: bk.Engine) -> dict[str, Any]:
    run = model.bucket_value(phase, "time_s", bucket, engine.block_size)
    act = round(model.bucket_value(phase, "activation_bytes", bucket, engine.block_size))
    return {"phase": phase, "bucket": list(bucket), "time_s": run, "activation_bytes": act,
            "cold_s": compile_s(model, phase, bucket, engine) + run, "cached_s": graph_s(model, phase, bucket, engine)
            + run}


def graph_s(model: ServingModel, phase: str, bucket: bk.Bucket, engine: bk.Engine) -> float:
    """The bridge's HPU graph build of a bucket: paid cold and from a recipe cache alike."""
    return GRAPH_S_PER_NODE * model.bucket_value(phase, "nodes", bucket, engine.block_size)


def compile_s(model: ServingModel, phase: str, bucket: bk.Bucket, engine: bk.Engine) -> float:
    """A bucket's whole compile: the graph compiler's and the bridge's."""
    return (COMPILE_S_PER_SLICE * model.bucket_value(phase, "slices", bucket, engine.block_size)
            + graph_s(model, phase, bucket, engine))


def warmup(rows: list[dict[str, Any]], mem: Memory) -> dict[str, Any]:
    per = {p: {"graphs": sum(r["phase"] == p for r in rows),
               "cold_s": sum(r["cold_s"] for r in rows if r["phase"] == p),
               "cached_s": sum(r["cached_s"] for r in rows if r["phase"] == p)} for p in PHASES}
    peak = max((r["activation_bytes"] for r in rows), default=0)
    graphs = len(rows) * GRAPH_BYTES
    return {"graphs": len(rows), "cold_s": sum(r["cold_s"] for r in rows), "cached_s": sum(r["cached_s"] for r in rows),
            "phases": per, "peak_step_bytes": peak, "graph_bytes": graphs,
            "graph_memory_fits": graphs <= mem.graph_reserved, "fits": peak + graphs <= mem.warmup_room}


def warmup_steps(rows: list[dict[str, Any]], mem: Memory, grid: bk.Grid, engine: bk.Engine) -> dict[str, Any]:
    """Each warm-up step against the room the weights and KV cache leave: the KV cache's allocation, then every
    bucket in warm-up order with the graphs compiled before it; the first step that does not fit, and why."""
    if mem.warmup_room < 0:
        return {"fits": False, "steps_checked": 0, "total": len(rows), "first_oom": {
            "step": "KV cache allocation", "need_bytes": mem.kv_bytes, "room_bytes": mem.hbm - mem.weights,
            "change": _kv_fix(mem)}}
    held = 0
    for i, r in enumerate(rows):
        need = r["activation_bytes"]
        if need + held > mem.warmup_room:
            return {"fits": False, "steps_checked": i + 1, "total": len(rows), "first_oom": {
                "step": f"{r['phase']} bucket {tuple(r['bucket'])}", "index": i, "need_bytes": need,
                "graphs_bytes": held, "room_bytes": mem.warmup_room, "change": _fix(r, mem, grid, engine)}}
        held += GRAPH_BYTES
    return {"fits": True, "steps_checked": len(rows), "total": len(rows), "first_oom": None}


def _kv_fix(mem: Memory) -> str:
    most = (mem.hbm - mem.weights) // mem.block_bytes
    return f"--num-gpu-blocks-override {mem.blocks:,} is past the {most:,} blocks the card holds: lower it or drop it"


def _fix(row: dict[str, Any], mem: Memory, grid: bk.Grid, engine: bk.Engine) -> str:
    """The setting that removes an out-of-memory step."""
    if row["phase"] == "decode" and row["bucket"][2] > mem.blocks and not engine.contiguous:
        return (f"decode bucket {tuple(row['bucket'])} wants {row['bucket'][2]:,} KV blocks where {mem.blocks:,} "
                "exist (non-contiguous paged attention counts block references): set VLLM_CONTIGUOUS_PA=true, "
                "lower --max-num-seqs or --max-model-len, or follow vllm-gaudi main (its PR #1700 caps decode "
                "blocks at 3x the cache)")
    if row["phase"] == "decode":
        return ("lower VLLM_DECODE_BLOCK_BUCKET_MAX or --max-num-seqs, or raise VLLM_GRAPH_RESERVED_MEM (room for "
                "warm-up) or lower --gpu-memory-utilization")
    return ("lower --max-num-batched-tokens (the largest prompt bucket), or raise VLLM_GRAPH_RESERVED_MEM or lower "
            "--gpu-memory-utilization (room for warm-up)")


def costs(model: ServingModel, engine: bk.Engine) -> Costs:
    return Costs(lambda b: model.bucket_value("prompt", "time_s", b, engine.block_size),
                 lambda b: model.bucket_value("decode", "time_s", b, engine.block_size),
                 lambda phase, b: compile_s(model, phase, b, engine))


# -- the plan ---------------------------------------------------------------------------------------------------

def plan(model: ServingModel, engine: bk.Engine, env: Mapping[str, str], requests: list[Request] | None = None,
         warmup_budget: float | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The serving plan (see the module docstring) for a loaded model."""
    say = progress or (lambda _: None)
    engine = bk.resolve(engine, bk.bucket_env(env))
    prompt_grid = bk.generate(engine, None, env)  # the prompt grid does not depend on the cache
    longest = max(q for _, q, _ in prompt_grid.prompt)
    biggest = max(b for b, _, _ in prompt_grid.prompt)
    say("fitting the cost of prompt and decode buckets")
    model.fit((biggest, max(longest, min(_trace_max(requests, "prompt"), engine.batched_tokens))),
              (engine.max_num_seqs, engine.max_num_seqs * engine.max_model_len), engine.block_size)
    mem = memory(model, engine)
    grid = bk.generate(engine, mem.blocks, env)
    rows = bucket_rows(model, grid, engine)
    release = bk.RELEASES[engine.release]
    doc = {"model": model.name, "target": model.target, "dtype": model.dtype, "cards": model.cards,
           "runtime_scale_patching": model.runtime_scale_patching,
           "estimate": True, "vllm_gaudi": {"release": release.name, "commit": release.commit, "date": release.date,
                                            "repository": "https://github.com/vllm-project/vllm-gaudi"},
           "engine": engine.__dict__ | {"max_num_batched_tokens": engine.batched_tokens,
                                        "max_num_prefill_seqs": engine.prefill_seqs,
                                        "contiguous_pa": engine.contiguous},
           "grid": _grid_doc(grid), "memory": mem.to_dict(),
           "max_concurrent_seqs": min(engine.max_num_seqs, mem.blocks // engine.blocks_per_seq(engine.max_model_len)),
           "buckets": rows, "warmup": warmup(rows, mem) | {"steps": warmup_steps(rows, mem, grid, engine)}}
    doc["autocalc"] = _autocalc(model, engine, mem, grid, doc["max_concurrent_seqs"])
    doc["fit"] = {"held_out_error": {p: model.surrogates[p].error for p in PHASES},
                  "shapes_measured": model.measured, "calibration": CALIBRATION}
    if requests:
        say(f"replaying {len(requests):,} requests on the grid")
        doc["trace"] = _serve(requests, grid, engine, mem, model, warmup_budget, say)
    return doc


def _autocalc(model: ServingModel, engine: bk.Engine, mem: Memory, grid: bk.Grid, concurrent: int) -> dict[str, Any]:
    """Intel's autocalc for the same deployment, and where it differs from the plan."""
    auto = autocalc.estimate(mem.hbm, mem.weights, model.kv_bytes_per_token, model.cards, engine.max_model_len,
                             engine.block_size, engine.batched_tokens, engine.prefill_seqs,
                             engine.gpu_memory_utilization, engine.contiguous)
    return auto | {"differences": autocalc.compare(auto, grid.graphs, engine.graph_reserved_mem, engine.max_num_seqs,
                                                   concurrent)}


def _trace_max(requests: list[Request] | None, what: str) -> int:
    if not requests:
        return 0
    return max((r.prompt if what == "prompt" else r.prompt + r.output) for r in requests)


def _grid_doc(grid: bk.Grid) -> dict[str, Any]:
    return {"strategy": grid.strategy, "prompt": [list(s) for s in grid.prompt],
            "decode": [list(s) for s in grid.decode], "graphs": grid.graphs,
            "ranges": {k: list(v) for k, v in grid.ranges.items()},
            "values": {k: list(v) for k, v in grid.values.items()},
            "env": dict(grid.env), "ignored_env": list(grid.ignored), "omitted": dict(grid.omitted),
            "skipped_file_lines": list(grid.skipped_lines)}


def _serve(requests, grid, engine, mem, model, budget, say) -> dict[str, Any]:
    cost = costs(model, engine)
    base = replay(requests, grid, engine, mem.blocks, cost)
    out = {"requests": len(requests), "default": _explained(base.summary(), grid, engine),
           "histogram": _histogram(requests),
           "decode_blocks": _blocks(base.shapes["decode"])}
    if budget is not None:
        say("searching bucket settings within the warm-up budget")
        out["recommended"] = _recommended(requests, base.shapes, model, engine, mem, budget, cost)
    return out


SEARCH_ROUNDS = 3


def _recommended(requests, seen, model, engine, mem, budget, cost) -> dict[str, Any]:
    """The best grid for the shapes seen, replayed; a grid changes how prefills are batched (its largest prompt
    batch), so the shapes its own replay runs are added and the search repeated until none is left unwarmed."""
    seen = {phase: dict(shapes) for phase, shapes in seen.items()}
    found = None
    for _ in range(SEARCH_ROUNDS):
        best = recommend(seen, model, engine, mem, budget)
        if best is None:
            break
        rep = replay(requests, best[1], engine, mem.blocks, cost)
        found = (best, rep)
        if not rep.unwarmed:
            break
        for phase, shapes in rep.shapes.items():
            for shape, n in shapes.items():
                seen[phase][shape] = seen[phase].get(shape, 0) + n
    if found is None:
        return {"budget_s": budget, "reason": "no linear grid covering the trace warms up within the budget"}
    (env, chosen), rep = found
    return {"env": env, "grid": _grid_doc(chosen), "budget_s": budget,
            "warmup": warmup(bucket_rows(model, chosen, engine), mem), **_explained(rep.summary(), chosen, engine)}


def _explained(summary: dict[str, Any], grid: bk.Grid, engine: bk.Engine) -> dict[str, Any]:
    """Each unwarmed shape with why the grid lacks it."""
    for u in summary["unwarmed"]:
        u["why"] = _why(u["phase"], tuple(u["shape"]), grid, engine)
    return summary


def _why(phase: str, shape: tuple[int, ...], grid: bk.Grid, engine: bk.Engine) -> str:
    """Why no bucket covers a step (vLLM-Gaudi then compiles its fallback bucket, ``shape``)."""
    shapes = grid.prompt if phase == "prompt" else grid.decode
    names = ("batch", "query", "context blocks") if phase == "prompt" else ("batch", "query", "blocks")
    for i, name in enumerate(names):
        top = max((s[i] for s in shapes), default=0)
        if shape[i] > top:
            return f"{name} {shape[i]} is past the largest bucket's {top}"
    if phase == "prompt" and shape[0] * shape[1] > engine.batched_tokens:
        return (f"{shape[0]} x {shape[1]} padded tokens are over max_num_batched_tokens {engine.batched_tokens}, "
                "so no grid warms it: lower VLLM_PROMPT_BS_BUCKET_MAX or raise --max-num-batched-tokens")
    return "each dimension has a bucket, but no bucket covers all of them"


def _histogram(requests: list[Request], bins: int = 32) -> dict[str, dict[str, list]]:
    """The trace's prompt and output lengths, binned."""
    out = {}
    for name, values in (("prompt", [r.prompt for r in requests]), ("output", [r.output for r in requests])):
        counts, edges = np.histogram(values, bins=bins)
        out[name] = {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}
    return out


def _blocks(decode_shapes: Mapping[tuple[int, int], int]) -> dict[str, list[int]]:
    """Decode steps by the KV blocks their batch held (unpadded)."""
    by: dict[int, int] = {}
    for (_, blocks), n in decode_shapes.items():
        by[blocks] = by.get(blocks, 0) + n
    keys = sorted(by)
    return {"blocks": keys, "steps": [by[k] for k in keys]}


# -- recommendation -------------------------------------------------------------------------------------------

def recommend(shapes: Mapping[str, Mapping[tuple[int, int], int]], model: ServingModel, engine: bk.Engine,
              mem: Memory, budget: float) -> tuple[dict[str, str], bk.Grid] | None:
    """The linear grid with the least device time over the trace's batch shapes (padding waste and the compiles
    of unwarmed shapes) whose cold warm-up fits ``budget`` seconds; (its variables, the grid) or None."""
    best, best_cost = None, math.inf
    prompts = [(c, _cold(model, engine, mem, "prompt", c))
               for c in _candidates("prompt", shapes["prompt"], engine, mem)]
    decodes = [(c, _cold(model, engine, mem, "decode", c))
               for c in _candidates("decode", shapes["decode"], engine, mem)]
    p_cost = {c: _trace_cost(model, engine, mem, "prompt", c, shapes["prompt"]) for c, _ in prompts}
    d_cost = {c: _trace_cost(model, engine, mem, "decode", c, shapes["decode"]) for c, _ in decodes}
    for pc, p_warm in prompts:
        for dc, d_warm in decodes:
            total = p_cost[pc] + d_cost[dc]
            if p_warm + d_warm <= budget and total < best_cost:
                best, best_cost = (pc, dc), total
    if best is None:
        return None
    env = bk.settings_env(dict(best[0]) | dict(best[1]), engine.release)
    return env, bk.generate(engine, mem.blocks, env)


Candidate = tuple[tuple[str, tuple[int, int, int]], ...]
MAX_CANDIDATE_GRAPHS = 2_000  # a grid past this warms for hours; no budget worth searching admits it


def _candidates(phase: str, seen: Mapping[tuple[int, int], int], engine: bk.Engine, mem: Memory) -> list[Candidate]:
    """Linear (min, step, max) ranges per dimension covering every shape the trace ran: power-of-two steps (in
    blocks for prompt lengths) from the largest value down to 1/64 of it (batch) or 1/128 (length, blocks), at
    most MAX_CANDIDATE_GRAPHS buckets each; prompt batches also capped at smaller powers of two (fewer
    sequences a prefill, so that fewer padded batches exceed the token budget)."""
    if not seen:
        return []
    top_b, top_x = max(b for b, _ in seen), max(x for _, x in seen)
    limit_b = engine.max_num_seqs  # a prompt batch's MAX is also the runner's max_num_prefill_seqs
    unit = engine.block_size if phase == "prompt" else 1
    cap_x = engine.max_model_len if phase == "prompt" else mem.blocks
    dims = ("bs", "query") if phase == "prompt" else ("bs", "block")
    out = []
    caps = [top_b] + ([p for p in _powers(1, top_b, 64) if p < top_b] if phase == "prompt" else [])
    for b_step, b_top in ((s, c) for c in caps for s in _powers(1, c, 64) if s <= c):
        b_max = min(limit_b, -(-b_top // b_step) * b_step)
        for x_step in (unit * p for p in _powers(1, -(-top_x // unit), 128)):
            x_min = min(x_step, cap_x)
            x_max = min(cap_x, max(x_min, -(-top_x // x_step) * x_step))
            if (b_max // b_step + 6) * (x_max // x_step + 6) <= MAX_CANDIDATE_GRAPHS:
                out.append(((f"{phase}_{dims[0]}", (1, b_step, max(1, b_max))),
                            (f"{phase}_{dims[1]}", (x_min, x_step, x_max))))
    return list(dict.fromkeys(out))


def _powers(low: int, top: int, spread: int) -> list[int]:
    """Powers of two from the one at or above ``top`` down to ``top / spread`` (at least ``low``)."""
    high = 1 << max(0, (top - 1).bit_length())
    return sorted({max(low, high >> k) for k in range(spread.bit_length())})


def _grid_for(engine: bk.Engine, mem: Memory, phase: str, cand: Candidate) -> bk.Grid:
    env = bk.settings_env(dict(cand), engine.release)
    return bk.generate(engine, None if phase == "prompt" else mem.blocks, env)


def _cold(model: ServingModel, engine: bk.Engine, mem: Memory, phase: str, cand: Candidate) -> float:
    grid = _grid_for(engine, mem, phase, cand)
    shapes = grid.prompt if phase == "prompt" else grid.decode
    return sum(compile_s(model, phase, b, engine) + model.bucket_value(phase, "time_s", b, engine.block_size)
               for b in shapes)


def _trace_cost(model: ServingModel, engine: bk.Engine, mem: Memory, phase: str, cand: Candidate,
                seen: Mapping[tuple[int, int], int]) -> float:
    """Device seconds of the trace's steps of ``phase`` padded onto the candidate grid, plus one compile per
    shape outside it."""
    grid = _grid_for(engine, mem, phase, cand)
    shapes = [(b, q) for b, q, c in grid.prompt if c == 0] if phase == "prompt" else [(b, k) for b, _, k in grid.decode]
    warmed = set(shapes)
    bs_values = np.array(sorted({b for b, _ in shapes}))
    x_values = np.array(sorted({x for _, x in shapes}))
    raw = np.array(list(seen), dtype=np.int64).reshape(-1, 2)
    counts = np.array(list(seen.values()), dtype=float)
    if phase == "prompt":  # a prefill of more sequences than the largest batch runs as several
        parts = -(-raw[:, 0] // bs_values.max())
        raw, counts = np.stack([-(-raw[:, 0] // parts), raw[:, 1]], 1), counts * parts
    pb, px = _pad(bs_values, raw[:, 0]), _pad(x_values, raw[:, 1])
    if phase == "decode":
        px = np.minimum(px, mem.blocks)
    coef = model.surrogates[phase].coef["time_s"]
    xs = px * (1 if phase == "prompt" else engine.block_size)
    feats = (np.stack([np.ones_like(xs), pb, pb * xs, pb * xs * xs], 1) if phase == "prompt"
             else np.stack([np.ones_like(xs), pb, xs], 1)).astype(float)
    total = float(counts @ (feats @ coef))
    missing = {(int(b), int(x)) for b, x in zip(pb, px) if (int(b), int(x)) not in warmed}
    for b, x in missing:
        total += compile_s(model, phase, (b, x, 0) if phase == "prompt" else (b, 1, x), engine)
    return total


def _pad(values: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Each raw value padded to the next bucket value, or left as is past the largest."""
    idx = np.searchsorted(values, raw)
    inside = idx < len(values)
    return np.where(inside, values[np.minimum(idx, len(values) - 1)], raw)




# -- a plan read back (hpurecipe warm --serving-plan) ------------------------------------------------------------

MAX_PLAN_BYTES = 64 << 20


def planned_points(doc: Any) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The prefill points (batch, input_len) and decode points (batch, kv_len: each sequence's share of the
    bucket's blocks) of a serving plan's JSON, checked as data (PlanError naming the field). Prompt buckets are
    vLLM-Gaudi's (batch, query, context blocks); a model file's prefill step has no context input, so the buckets
    that differ only in context blocks are one point (batch, query)."""
    grid = doc.get("grid") if isinstance(doc, dict) else None
    engine = doc.get("engine") if isinstance(doc, dict) else None
    block = engine.get("block_size") if isinstance(engine, dict) else None
    if not isinstance(grid, dict) or not _int_ok(block):
        raise PlanError("serving plan: expected the JSON of hpurecipe serving-plan --json (grid, engine.block_size)")
    phases = []
    for phase in PHASES:
        shapes = grid.get(phase)
        if not isinstance(shapes, list) or len(shapes) > bk.MAX_GRAPHS or not all(
                isinstance(s, list) and len(s) == 3 and _int_ok(s[0]) and _int_ok(s[1]) and _int_ok(s[2], 0)
                for s in shapes):
            raise PlanError(f"serving plan: grid.{phase}: expected at most {bk.MAX_GRAPHS:,} [batch, query, blocks] "
                            "buckets of integers (batch and query from 1, blocks from 0)")
        phases.append(shapes)
    prompt = [{"batch": b, "input_len": q} for b, q in dict.fromkeys((b, q) for b, q, _ in phases[0])]
    decode = [{"batch": b, "kv_len": max(1, -(-k * block // b))} for b, _, k in phases[1]]
    return prompt, decode


def _int_ok(value: Any, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= bk.MAX_VALUE


__all__ = ["COMPILE_S_PER_SLICE", "GRAPH_BYTES", "GRAPH_S_PER_NODE", "Memory", "PlanError", "bucket_rows",
           "check_engine", "check_fits", "compile_s", "costs", "graph_s", "memory", "plan", "planned_points",
           "recommend", "warmup", "warmup_steps"]
