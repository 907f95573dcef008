"""The serving plan: for a model on ``cards`` cards of ``target``, vLLM-Gaudi's bucket grid, the memory it leaves
for the KV cache, warm-up time cold and from a recipe cache, and (given a trace) continuous batching over it,
the recompiles it would cause and the bucket settings that fit it best within a warm-up budget; a JSON-ready dict.

Memory follows vLLM-Gaudi's start-up (docs/features/warmup.md): weights are loaded, a profiling run at the largest
prompt bucket takes its activations, ``gpu_memory_utilization`` of what is then free is usable, of which
``VLLM_GRAPH_RESERVED_MEM`` is kept for graphs and the rest becomes KV-cache blocks of ``block_size`` tokens.

Warm-up compiles and runs every bucket once. Compiling a bucket is two stages (vLLM-Gaudi's managing_warm-up.md):
the graph compiler's, ``COMPILE_S_PER_SLICE`` per unit of its work (``model.py``: the nodes of the distinct graphs
it compiles × on-chip slices), which a recipe cache skips, and the bridge's HPU graph build, ``GRAPH_S_PER_NODE`` per node, which runs from a recipe cache
too. Both factors are fitted on the one calibration row (bench/serving_bench.py) and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..analyze import hbm_bytes
from ..capacity import CapacityError
from . import buckets as bk
from .model import ServingModel
from .simulate import Costs, replay
from .trace import Request

# Fitted by bench/serving_bench.py on vLLM-Gaudi's managing_warm-up.md row: LLaMA 3.1 8B, TP 1, bf16, the bucket
# settings that page gives (47 graphs), max-model-len 8192: 66 s cold, 23 s from a recipe cache. Planned on gaudi2.
COMPILE_S_PER_SLICE = 1.797e-4
GRAPH_S_PER_NODE = 1.146e-4
CALIBRATION = "vLLM-Gaudi docs, managing_warm-up.md: LLaMA 3.1 8B TP1 bf16, 66 s cold / 23 s cached"


class PlanError(CapacityError):
    """A deployment that cannot be planned: a model too big for the cards, a KV cache that cannot hold one
    sequence, a max_model_len past the model's context (one line naming the field and its valid range)."""


@dataclass(frozen=True)
class Memory:
    hbm: int
    weights: int
    profile_activation: int
    usable: int
    graph_reserved: int
    kv_bytes: int
    block_bytes: int
    blocks: int

    def to_dict(self) -> dict[str, int]:
        return {"hbm_bytes": self.hbm, "weights_bytes": self.weights, "profile_activation_bytes":
                self.profile_activation, "usable_bytes": self.usable, "graph_reserved_bytes": self.graph_reserved,
                "kv_cache_bytes": self.kv_bytes, "block_bytes": self.block_bytes, "kv_blocks": self.blocks}


def check_engine(engine: bk.Engine, context: int | None) -> None:
    """PlanError for engine arguments out of range (before any work)."""
    if context is not None and engine.max_model_len > context:
        raise PlanError(f"--max-model-len {engine.max_model_len}: past the model's context length {context} "
                        f"(config); expected 1 to {context}")
    if not 0 < engine.gpu_memory_utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization {engine.gpu_memory_utilization}: expected above 0, at most 1")
    if not 0 <= engine.graph_reserved_mem < 1:
        raise PlanError(f"VLLM_GRAPH_RESERVED_MEM={engine.graph_reserved_mem}: expected 0 or more, below 1")


def memory(model: ServingModel, engine: bk.Engine, prompt_grid: bk.Grid) -> Memory:
    """The KV-cache blocks left after weights and the profiling run (PlanError when none fit one sequence)."""
    hbm = hbm_bytes(model.target)
    _check_weights(model.name, model.weights_bytes, model.target, model.cards)
    bs, seq = max(prompt_grid.prompt, key=lambda s: s[0] * s[1])
    profile = round(model.value("prompt", "activation_bytes", bs, seq))
    free = max(0, hbm - model.weights_bytes - profile)
    usable = int(free * engine.gpu_memory_utilization)
    reserved = int(usable * engine.graph_reserved_mem)
    block = max(1, round(model.kv_bytes_per_token * engine.block_size))
    blocks = (usable - reserved) // block
    need = engine.blocks_per_seq(engine.max_model_len)
    if blocks < need:
        raise PlanError(f"KV cache: {blocks} blocks of {engine.block_size} tokens fit after weights and activations, "
                        f"fewer than the {need} one sequence of --max-model-len {engine.max_model_len} needs; raise "
                        f"--gpu-memory-utilization (at most 1), add --cards or lower --max-model-len")
    return Memory(hbm, model.weights_bytes, profile, usable, reserved, usable - reserved, block, blocks)


def check_fits(name: str, target: str, cards: int, weights_bytes: int, kv_bytes_per_token: float,
               engine: bk.Engine) -> None:
    """PlanError, from the config alone and before any lowering, when the weights fill a card or the memory they
    leave cannot hold one sequence's KV cache even before activations and graphs take their share (``memory``
    checks again, exactly, after lowering)."""
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

def x_of(phase: str, shape: tuple[int, int], engine: bk.Engine) -> int:
    """The surrogate's length argument: prompt length, or the decode bucket's KV tokens."""
    return shape[1] if phase == "prompt" else shape[1] * engine.block_size


def bucket_rows(model: ServingModel, grid: bk.Grid, engine: bk.Engine) -> list[dict[str, Any]]:
    rows = []
    for phase, shapes in (("prompt", grid.prompt), ("decode", grid.decode)):
        for shape in shapes:
            x = x_of(phase, shape, engine)
            run = model.value(phase, "time_s", shape[0], x)
            rows.append({"phase": phase, "batch": shape[0], ("length" if phase == "prompt" else "blocks"): shape[1],
                         "time_s": run, "activation_bytes": round(model.value(phase, "activation_bytes", shape[0], x)),
                         "cold_s": compile_s(model, phase, shape[0], x) + run,
                         "cached_s": graph_s(model, phase, shape[0], x) + run})
    return rows


def graph_s(model: ServingModel, phase: str, batch: int, x: int) -> float:
    """The bridge's HPU graph build of a bucket: paid cold and from a recipe cache alike."""
    return GRAPH_S_PER_NODE * model.value(phase, "nodes", batch, x)


def compile_s(model: ServingModel, phase: str, batch: int, x: int) -> float:
    """A bucket's whole compile: the graph compiler's and the bridge's."""
    return COMPILE_S_PER_SLICE * model.value(phase, "slices", batch, x) + graph_s(model, phase, batch, x)


def warmup(rows: list[dict[str, Any]], mem: Memory) -> dict[str, Any]:
    peak_act = max((r["activation_bytes"] for r in rows), default=0)
    peak = mem.weights + mem.kv_bytes + peak_act
    per = {p: {"graphs": sum(r["phase"] == p for r in rows), "cold_s": sum(r["cold_s"] for r in rows if r["phase"] == p),
               "cached_s": sum(r["cached_s"] for r in rows if r["phase"] == p)} for p in ("prompt", "decode")}
    return {"graphs": len(rows), "cold_s": sum(r["cold_s"] for r in rows), "cached_s": sum(r["cached_s"] for r in rows),
            "phases": per, "peak_bytes": peak, "peak_activation_bytes": peak_act, "fits": peak <= mem.hbm,
            "graph_memory_fits": peak_act <= mem.graph_reserved}


def costs(model: ServingModel, engine: bk.Engine) -> Costs:
    def compiled(phase: str, shape: tuple[int, int]) -> float:
        return compile_s(model, phase, shape[0], x_of(phase, shape, engine))

    return Costs(lambda b, s: model.value("prompt", "time_s", b, s),
                 lambda b, k: model.value("decode", "time_s", b, k * engine.block_size), compiled)


# -- the plan ---------------------------------------------------------------------------------------------------

def plan(model: ServingModel, engine: bk.Engine, env: Mapping[str, str], requests: list[Request] | None = None,
         warmup_budget: float | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The serving plan (see the module docstring) for a loaded model."""
    say = progress or (lambda _: None)
    prompt_grid = bk.generate(engine, None, env)  # the prompt grid does not depend on the cache
    longest = max(s[1] for s in prompt_grid.prompt)
    biggest = max(b for b, _ in prompt_grid.prompt)
    say("fitting the cost of prompt and decode buckets")
    model.fit((biggest, max(longest, _trace_max(requests, "prompt"))),
              (engine.max_num_seqs, engine.max_num_seqs * engine.max_model_len), engine.block_size)
    mem = memory(model, engine, prompt_grid)
    grid = bk.generate(engine, mem.blocks, env)
    rows = bucket_rows(model, grid, engine)
    doc = {"model": model.name, "target": model.target, "dtype": model.dtype, "cards": model.cards,
           "estimate": True, "engine": engine.__dict__ | {"max_num_batched_tokens": engine.batched_tokens,
                                                          "max_num_prefill_seqs": engine.prefill_seqs},
           "grid": _grid_doc(grid), "memory": mem.to_dict(),
           "max_concurrent_seqs": min(engine.max_num_seqs, mem.blocks // engine.blocks_per_seq(engine.max_model_len)),
           "buckets": rows, "warmup": warmup(rows, mem)}
    doc["fit"] = {"held_out_error": {p: model.surrogates[p].error for p in ("prompt", "decode")},
                  "shapes_measured": model.measured, "calibration": CALIBRATION}
    if requests:
        say(f"replaying {len(requests):,} requests on the grid")
        doc["trace"] = _serve(requests, grid, engine, mem, model, warmup_budget, say)
    return doc


def _trace_max(requests: list[Request] | None, what: str) -> int:
    if not requests:
        return 0
    return max((r.prompt if what == "prompt" else r.prompt + r.output) for r in requests)


def _grid_doc(grid: bk.Grid) -> dict[str, Any]:
    return {"strategy": grid.strategy, "prompt": [list(s) for s in grid.prompt],
            "decode": [list(s) for s in grid.decode], "graphs": grid.graphs,
            "ranges": {k: list(v) for k, v in grid.ranges.items()}, "env": dict(grid.env),
            "ignored_env": list(grid.ignored), "omitted_prompt_buckets": grid.omitted}


def _serve(requests, grid, engine, mem, model, budget, say) -> dict[str, Any]:
    cost = costs(model, engine)
    base = replay(requests, grid, engine, mem.blocks, cost)
    out = {"requests": len(requests), "default": _explained(base.summary(), grid, engine), "histogram": _histogram(requests),
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


def _why(phase: str, shape: tuple[int, int], grid: bk.Grid, engine: bk.Engine) -> str:
    shapes = grid.prompt if phase == "prompt" else grid.decode
    names = ("batch", "length") if phase == "prompt" else ("batch", "blocks")
    for i, name in enumerate(names):
        top = max((s[i] for s in shapes), default=0)
        if shape[i] > top:
            return f"{name} {shape[i]} is past the largest bucket's {top}"
    if phase == "prompt" and shape[0] * shape[1] > engine.batched_tokens:
        return (f"{shape[0]} x {shape[1]} padded tokens are over max_num_batched_tokens {engine.batched_tokens}, "
                "so no grid warms it: lower VLLM_PROMPT_BS_BUCKET_MAX or raise --max-num-batched-tokens")
    return "each dimension has a bucket, but not this pair"


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
    prompts = [(c, _cold(model, engine, mem, "prompt", c)) for c in _candidates("prompt", shapes["prompt"], engine, mem)]
    decodes = [(c, _cold(model, engine, mem, "decode", c)) for c in _candidates("decode", shapes["decode"], engine, mem)]
    p_cost = {c: _trace_cost(model, engine, mem, "prompt", c, shapes["prompt"]) for c, _ in prompts}
    d_cost = {c: _trace_cost(model, engine, mem, "decode", c, shapes["decode"]) for c, _ in decodes}
    for pc, p_warm in prompts:
        for dc, d_warm in decodes:
            total = p_cost[pc] + d_cost[dc]
            if p_warm + d_warm <= budget and total < best_cost:
                best, best_cost = (pc, dc), total
    if best is None:
        return None
    env = bk.settings_env(dict(best[0]) | dict(best[1]))
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
    limit_b = engine.prefill_seqs if phase == "prompt" else engine.max_num_seqs
    unit = engine.block_size if phase == "prompt" else 1
    cap_x = engine.max_model_len if phase == "prompt" else mem.blocks
    dims = ("bs", "seq") if phase == "prompt" else ("bs", "block")
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
    env = bk.settings_env(dict(cand))
    return bk.generate(engine, None if phase == "prompt" else mem.blocks, env)


def _cold(model: ServingModel, engine: bk.Engine, mem: Memory, phase: str, cand: Candidate) -> float:
    grid = _grid_for(engine, mem, phase, cand)
    shapes = grid.prompt if phase == "prompt" else grid.decode
    return sum(compile_s(model, phase, b, x_of(phase, (b, x), engine))
               + model.value(phase, "time_s", b, x_of(phase, (b, x), engine)) for b, x in shapes)


def _trace_cost(model: ServingModel, engine: bk.Engine, mem: Memory, phase: str, cand: Candidate,
                seen: Mapping[tuple[int, int], int]) -> float:
    """Device seconds of the trace's steps of ``phase`` padded onto the candidate grid, plus one compile per
    shape outside it."""
    grid = _grid_for(engine, mem, phase, cand)
    shapes = grid.prompt if phase == "prompt" else grid.decode
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
        total += compile_s(model, phase, b, x if phase == "prompt" else x * engine.block_size)
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
    bucket's blocks) of a serving plan's JSON, checked as data (PlanError naming the field)."""
    grid = doc.get("grid") if isinstance(doc, dict) else None
    engine = doc.get("engine") if isinstance(doc, dict) else None
    block = engine.get("block_size") if isinstance(engine, dict) else None
    if not isinstance(grid, dict) or not _int_ok(block):
        raise PlanError("serving plan: expected the JSON of hpurecipe serving-plan --json (grid, engine.block_size)")
    phases = []
    for phase in ("prompt", "decode"):
        shapes = grid.get(phase)
        if not isinstance(shapes, list) or len(shapes) > bk.MAX_GRAPHS or not all(
                isinstance(s, list) and len(s) == 2 and all(_int_ok(v) for v in s) for s in shapes):
            raise PlanError(f"serving plan: grid.{phase}: expected at most {bk.MAX_GRAPHS:,} [batch, size] pairs of "
                            "positive integers")
        phases.append(shapes)
    prompt = [{"batch": b, "input_len": s} for b, s in phases[0]]
    decode = [{"batch": b, "kv_len": max(1, -(-k * block // b))} for b, k in phases[1]]
    return prompt, decode


def _int_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= bk.MAX_VALUE


__all__ = ["COMPILE_S_PER_SLICE", "GRAPH_S_PER_NODE", "Memory", "PlanError", "bucket_rows", "check_engine", "check_fits",
           "compile_s", "costs", "graph_s", "memory", "plan", "planned_points", "recommend", "warmup"]
