"""Capacity planning without weights: a generative model file's prefill and decode steps lowered once on the
meta device, then re-planned at any (batch, input length, output length) for estimated time, HBM, the
largest batch that fits and tokens/s.

Each step's model is built under ``torch.device("meta")`` (no weight is allocated) and traced with
``make_fx`` on fake tensors whose batch and length dimensions are symbolic, at small sample sizes; the
graph passes run once, and the bucket passes (memory plan, cost) run again at every point asked for,
with the symbols set from the axes. A symbol's value is read off the sample inputs: every input
dimension that changes with an axis is ``c + a * axis`` (two probes of ``make_inputs`` per axis).
tokens/s = batch * output / (prefill + Σ decode steps over KV lengths input .. input + output - 1).

Across cards (``cards``): the model file's ``PER_CARD`` shard of one card (tensor parallel over heads, KV
heads and the MLP, with its all-reduces; ``models/llama.py``) is planned per card, its collectives timed on
the target's scale-up fabric. A stack of identical layers is not lowered whole: the shard is lowered with one
and with two layers, and every figure (time, HBM, communication) is extrapolated linearly over ``LAYERS``
(exact for sums over layers; the intermediates arena, which does not grow with depth, is the two-layer one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ..capture.meta import trace_symbolic
from ..formats.recipe import Recipe
from ..lowering import LoweringContext, lower
from ..lowering.values import nbytes
from ..serve.session import Session
from ..settings import Settings
from ..targets import layout_problem
from ..diagnosis.analyze import hbm_bytes, largest_fitting, replanned_peak
from ..modelfiles.modelspec import ModelFileError, ModelSpec, spec_from, user_call

DTYPES = {"bf16": "native", "fp8": "fp8"}  # --dtype -> Settings.dtype_policy (weights and activations are bf16)
PREFILL_AXES, DECODE_AXES = ("batch", "input_len"), ("batch", "kv_len")
# ≥ 2 (0 and 1 specialize) and distinct from each other; "seq" is a training plan's tokens per sequence
SAMPLE = {"batch": 3, "input_len": 7, "kv_len": 7, "seq": 7}
DECODE_SAMPLES = 17  # decode steps evaluated exactly; the sum over the others is interpolated (see decode_s)
TP_GROUP = "tp"  # the process-group name a PER_CARD shard's collectives use while planning


class CapacityError(ModelFileError):
    """A model file or request capacity planning cannot serve (one line naming what is wrong)."""


@dataclass
class StepGraph:
    """One step lowered once (graph passes done); ``at(point)`` re-runs the bucket passes at the axes' values."""

    name: str
    template: Recipe
    ctx: LoweringContext
    lines: dict[str, tuple[int, dict[str, int]]]  # symbol -> (c, {axis: a}): value = c + Σ a * axis
    session: Session  # what lowers it at a point (plans only: its store keeps nothing)
    params: int = 0  # the graph's leading inputs that are parameters and buffers

    def env(self, point: Mapping[str, int]) -> dict[str, int]:
        return {s: c + sum(a * point[axis] for axis, a in coef.items()) for s, (c, coef) in self.lines.items()}

    def at(self, point: Mapping[str, int]) -> Recipe:
        """The recipe at exactly ``point`` (a bucket of one size per symbol)."""
        (recipe,) = self.session.recipes(self.template, self.ctx, [{s: [v, v] for s, v in self.env(point).items()}])
        return recipe

    def time_s(self, point: Mapping[str, int]) -> float:
        return self.at(point).facts["cost"]["total_s"]

    def peak_bytes(self, point: Mapping[str, int]) -> int:
        """The planned peak HBM at ``point`` (the memory pass alone: what the batch search needs)."""
        return replanned_peak(self.template, self.env(point))

    def estimate(self, point: Mapping[str, int]) -> dict[str, Any]:
        """Time, communication and per-card HBM (weights, KV cache, activations, comm buffers) at ``point``."""
        recipe = self.at(point)
        cost, memory, env = recipe.facts["cost"], recipe.facts["memory"], recipe.facts["plan_at"]
        weights = sum(nbytes(s, env) for s in recipe.inputs[:self.params])
        comms = cost.get("collectives", [])
        return {"time_s": cost["total_s"], "peak_hbm_bytes": memory["peak_bytes"], "input_bytes": memory["input_bytes"],
                "fits_hbm": memory["fits_hbm"], "bound": [c["bound"] for c in cost["clusters"]],
                "comm_s": cost.get("comm_s", 0.0), "exposed_comm_s": cost.get("exposed_comm_s", 0.0),
                "comm_latency_s": cost.get("comm_latency_s", 0.0), "collectives": len(comms),
                "hbm": {"weights_bytes": weights, "kv_cache_bytes": memory["input_bytes"] - weights,
                        "activation_bytes": memory["arena_bytes"],
                        "comm_buffer_bytes": max((c["bytes"] for c in comms), default=0)}}


@dataclass
class LayeredStep:
    """A step of ``layers`` layers, in identical groups of ``period`` layers, estimated from its one- and two-group
    lowerings (linear in depth)."""

    one: StepGraph
    two: StepGraph
    layers: int
    hbm: int
    period: int = 1

    @property
    def groups(self) -> int:
        return self.layers // self.period

    def _extend(self, a: float, b: float) -> float:
        return a + (self.groups - 1) * (b - a)

    def peak_bytes(self, point: Mapping[str, int]) -> int:
        return round(self._extend(self.one.peak_bytes(point), self.two.peak_bytes(point)))

    def estimate(self, point: Mapping[str, int]) -> dict[str, Any]:
        a, b = self.one.estimate(point), self.two.estimate(point)
        out = {k: self._extend(a[k], b[k]) for k in ("time_s", "comm_s", "exposed_comm_s", "comm_latency_s",
                                                    "collectives")}
        out["hbm"] = {k: round(self._extend(a["hbm"][k], b["hbm"][k])) for k in a["hbm"]}
        out["hbm"]["activation_bytes"] = b["hbm"]["activation_bytes"]  # the arena does not grow with depth
        out["hbm"]["comm_buffer_bytes"] = b["hbm"]["comm_buffer_bytes"]
        peak = round(self._extend(a["peak_hbm_bytes"], b["peak_hbm_bytes"]))
        return {**out, "collectives": round(out["collectives"]), "peak_hbm_bytes": peak,
                "input_bytes": round(self._extend(a["input_bytes"], b["input_bytes"])),
                "fits_hbm": peak <= self.hbm, "bound": b["bound"]}


def step_graphs(spec: ModelSpec, target: str, dtype: str,
                groups: Mapping[str, int] | None = None) -> tuple[StepGraph, StepGraph]:
    """The prefill and decode steps of a generative model file, lowered for ``target`` in ``dtype``."""
    if dtype not in DTYPES:
        raise CapacityError(f"dtype {dtype!r}: expected {' or '.join(DTYPES)}")
    if spec.decode is None:
        raise CapacityError(f"{spec.path}: no DECODE step; capacity planning needs a model file with a prefill "
                            f"step (AXES {', '.join(PREFILL_AXES)}) and DECODE (AXES {', '.join(DECODE_AXES)})")
    _require_axes(spec, PREFILL_AXES, "the prefill step")
    _require_axes(spec.decode, DECODE_AXES, "DECODE")
    return (trace_step(spec, "prefill", target, dtype, groups),
            trace_step(spec.decode, "decode", target, dtype, groups))


def _require_axes(spec: ModelSpec, axes: tuple[str, ...], what: str) -> None:
    if set(spec.axes) != set(axes):
        raise CapacityError(f"{spec.path}: {what} must have AXES {', '.join(axes)}; it has {', '.join(spec.axes)}")


def card_steps(spec: ModelSpec, target: str, dtype: str, cards: int) -> tuple[Any, Any]:
    """The prefill and decode steps of one card's shard over ``cards`` (LayeredSteps when LAYERS > 2)."""
    problem = layout_problem(target, cards)
    if problem:
        raise CapacityError(problem)
    if spec.per_card is None:
        raise CapacityError(f"{spec.path}: planning across cards needs PER_CARD(cards, group, layers) in the "
                            f"model file (one card's tensor-parallel shard, see models/llama.py)")
    groups = {TP_GROUP: cards}

    def shard(layers: int | None) -> tuple[StepGraph, StepGraph]:
        holder = user_call(spec.path, f"PER_CARD(cards={cards})", spec.per_card, cards=cards, group=TP_GROUP,
                           layers=layers)
        return step_graphs(spec_from(holder, f"{spec.path}:PER_CARD"), target, dtype, groups)

    period = spec.layer_period
    if not spec.layers or spec.layers <= 2 * period:
        return shard(None)
    (p1, d1), (p2, d2) = shard(period), shard(2 * period)
    hbm = hbm_bytes(target)
    return (LayeredStep(p1, p2, spec.layers, hbm, period), LayeredStep(d1, d2, spec.layers, hbm, period))


def trace_step(spec: ModelSpec, name: str, target: str, dtype: str,
               groups: Mapping[str, int] | None = None) -> StepGraph:
    """Build the step's model on the meta device, trace it on fake inputs and run the graph passes."""
    with torch.device("meta"):
        model = spec.build_model().eval().to(torch.bfloat16)
    unknown = [a for a in spec.axes if a not in SAMPLE]
    if unknown:
        raise CapacityError(f"{spec.path}: no plan for the axis {', '.join(unknown)}; plans know the axes "
                            f"{', '.join(SAMPLE)}")
    point = {a: SAMPLE[a] for a in spec.axes}
    inputs = [_bf16(t) for t in spec.split(spec.inputs(point))]
    dims = _dim_lines(spec, point, inputs)
    gm = user_call(spec.path, "the model traced on fake inputs", trace_symbolic, model, inputs, dims)
    session = Session(Settings.from_options({**spec.options, "target": target, "cache": False, "execute": False,
                                             "dtype_policy": DTYPES[dtype]}, env={}))
    ctx = LoweringContext(settings=session.settings, name=f"{spec.name}_{name}", kind="inference", gm=gm,
                          groups=dict(groups or {}))
    template = lower(gm, ctx).template
    ctx = ctx.for_bucket({})  # the FX graph is not needed again; dropping it frees the tracer's memory
    first = len(template.inputs) - len(inputs)  # the graph's inputs: parameters and buffers, then the step's
    lines = {s: dims[(i - first, d)] for s, (i, d) in zip(template.symbols, template.symbol_sources)}
    return StepGraph(name, template, ctx, lines, session, first)


def _bf16(t: Any) -> Any:
    """A float input in bf16 (the activations' dtype of the estimate); others unchanged."""
    return t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _dim_lines(spec: ModelSpec, point: dict, inputs: list) -> dict[tuple[int, int], tuple[int, dict[str, int]]]:
    """(input, dim) -> (c, {axis: a}) for every dimension that follows an axis, from one probe per axis."""
    lines: dict[tuple[int, int], tuple[int, dict[str, int]]] = {}
    for axis in spec.axes:
        probe = spec.split(spec.inputs({**point, axis: point[axis] + 2}))
        for i, (t0, t1) in enumerate(zip(inputs, probe)):
            for d, (n0, n1) in enumerate(zip(getattr(t0, "shape", ()), getattr(t1, "shape", ()))):
                a, rest = divmod(n1 - n0, 2)
                if n1 != n0 and not rest:
                    c, coef = lines.get((i, d), (n0, {}))
                    lines[(i, d)] = (c - a * point[axis], {**coef, axis: a})
                elif rest:
                    raise CapacityError(f"{spec.path}: input {i} dimension {d} does not grow linearly with {axis}")
    return lines


# -- the plan -------------------------------------------------------------------------------------------------

def decode_points(input_len: int, output_len: int) -> list[tuple[int, float]]:
    """(KV length, weight) pairs whose weighted decode times sum to Σ over KV lengths input .. input+output-1.

    Up to DECODE_SAMPLES steps are evaluated exactly; beyond, steps are sampled evenly and the sum is the
    trapezoid rule plus half the end points — exact where a step's time is linear in the KV length between
    samples (the roofline is piecewise linear in it), otherwise an interpolation."""
    first, last = input_len, input_len + output_len - 1
    if output_len <= DECODE_SAMPLES:
        return [(k, 1.0) for k in range(first, last + 1)]
    ks = sorted({first + round(j * (last - first) / (DECODE_SAMPLES - 1)) for j in range(DECODE_SAMPLES)})
    weights = dict.fromkeys(ks, 0.0)
    for a, b in zip(ks, ks[1:]):
        weights[a] += (b - a) / 2
        weights[b] += (b - a) / 2
    weights[first] += 0.5
    weights[last] += 0.5
    return list(weights.items())


def capacity(spec: ModelSpec, target: str, dtype: str, input_len: int, output_len: int,
             batch: int | None = None, cards: int | None = None, trace: str | None = None,
             on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per-step estimated time and HBM, the largest batch that fits and tokens/s; a JSON-ready dict.
    ``cards``: plan one card's tensor-parallel shard over that many cards of a server (per-card figures).
    ``trace``: write one request at the chosen batch as a step-timeline trace (``plan_trace.py``).
    ``on_step(what)`` hears each stage as it starts (a front end's progress line)."""
    if input_len < 1 or output_len < 1 or (batch is not None and batch < 1) or (cards is not None and cards < 1):
        raise CapacityError("input length, output length, batch and cards must be positive integers")
    check_context(spec, input_len + output_len, f"--input-len {input_len} + --output-len {output_len}")
    step = on_step or _silent
    step("tracing and lowering the prefill and decode steps" + (f" of one card of {cards}" if cards else ""))
    if cards is None:
        prefill, decode = step_graphs(spec, target, dtype)
    else:
        prefill, decode = card_steps(spec, target, dtype, cards)
    doc = plan_capacity(prefill, decode, spec.name, target, dtype, input_len, output_len, batch, cards or 1,
                        on_step=step)
    if trace and doc["batch"]:
        from .plan_trace import write_request

        write_request(trace, prefill, decode, doc, [kv for kv, _ in decode_points(input_len, output_len)])
    return doc


def _silent(what: str) -> None:
    """No one listening for progress."""


def check_context(spec: ModelSpec, tokens: int, what: str) -> None:
    """CapacityError, before any tracing, when a sequence of ``tokens`` is longer than the model's CONTEXT."""
    if spec.context is not None and tokens > spec.context:
        raise CapacityError(f"{what} = {tokens:,} tokens: {spec.name} holds at most {spec.context:,} tokens "
                            "per sequence (CONTEXT in its model file)")


def plan_capacity(prefill, decode, model: str, target: str, dtype: str, input_len: int,
                  output_len: int, batch: int | None, cards: int = 1,
                  on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    hbm = hbm_bytes(target)
    last_kv = input_len + output_len - 1
    step = on_step or _silent

    def fits(b: int) -> bool:
        step(f"the largest batch that fits: trying {b}")
        return (prefill.peak_bytes({"batch": b, "input_len": input_len}) <= hbm
                and decode.peak_bytes({"batch": b, "kv_len": last_kv}) <= hbm)

    largest, note = largest_fitting(fits)
    chosen = batch or largest
    doc = {"model": model, "target": target, "dtype": dtype, "estimate": True, "cards": cards, "hbm_bytes": hbm,
           "input_len": input_len, "output_len": output_len,
           "max_batch": {"batch": largest, **({"note": note} if note else {}),
                         **({} if largest else {"reason": "even batch 1 does not fit"})},
           "batch": chosen, "steps": [], "tokens_per_s": None}
    if chosen:
        step(f"tokens/s at batch {chosen}")
        doc.update(throughput(prefill, decode, chosen, input_len, output_len))
    return doc


def throughput(prefill, decode, batch: int, input_len: int, output_len: int) -> dict[str, Any]:
    """The steps at ``batch`` (prefill, first and last decode step) and tokens/s over the whole request;
    the communication share is the collectives' time not hidden behind compute, over the request's time."""
    points = decode_points(input_len, output_len)  # always holds the first and the last KV length
    steps = {kv: decode.estimate({"batch": batch, "kv_len": kv}) for kv, _ in points}
    first = prefill.estimate({"batch": batch, "input_len": input_len})
    rows = [_step_row("prefill", first, input_len)]
    rows += [_step_row("decode", steps[kv], kv) for kv in sorted({input_len, input_len + output_len - 1})]

    def over_request(key: str) -> float:
        return first[key] + sum(w * steps[kv][key] for kv, w in points)

    decode_s = over_request("time_s") - first["time_s"]
    total_s = first["time_s"] + decode_s
    comm = {"comm_s": over_request("comm_s"), "exposed_comm_s": over_request("exposed_comm_s"),
            "comm_latency_s": over_request("comm_latency_s")}
    return {"steps": rows, "prefill_s": first["time_s"], "decode_s": decode_s, "total_s": total_s,
            "tokens_per_s": batch * output_len / total_s, "fits_hbm": all(r["fits_hbm"] for r in rows),
            "first_token_s": first["time_s"], **comm, "comm_share": comm["exposed_comm_s"] / total_s,
            "hbm_per_card": steps[input_len + output_len - 1]["hbm"],
            "decode_sampled": len(points) < output_len, "decode_steps_evaluated": len(points)}


def _step_row(step: str, est: dict[str, Any], length: int) -> dict[str, Any]:
    return {"step": step, "length": length, "time_s": est["time_s"], "peak_hbm_bytes": est["peak_hbm_bytes"],
            "input_bytes": est["input_bytes"], "fits_hbm": est["fits_hbm"], "bound": est["bound"],
            "comm_s": est["comm_s"], "collectives": est["collectives"]}


__all__ = ["CapacityError", "DTYPES", "LayeredStep", "StepGraph", "capacity", "card_steps", "decode_points",
           "plan_capacity", "step_graphs", "throughput", "trace_step"]
