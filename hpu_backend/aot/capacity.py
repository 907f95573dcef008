"""Capacity planning without weights: a generative model file's prefill and decode steps lowered once on the
meta device, then re-planned at any (batch, input length, output length) for estimated time, HBM, the
largest batch that fits and tokens/s.

Each step's model is built under ``torch.device("meta")`` (no weight is allocated) and traced with
``make_fx`` on fake tensors whose batch and length dimensions are symbolic, at small sample sizes; the
graph passes run once, and the bucket passes (memory plan, cost) run again at every point asked for,
with the symbols set from the axes. A symbol's value is read off the sample inputs: every input
dimension that changes with an axis is ``c + a * axis`` (two probes of ``make_inputs`` per axis).
tokens/s = batch * output / (prefill + Σ decode steps over KV lengths input .. input + output - 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..capture.meta import trace_symbolic
from ..formats.recipe import Recipe
from ..lowering import LoweringContext, lower, lower_bucket
from ..settings import Settings
from .analyze import hbm_bytes, largest_fitting, replanned_peak
from .modelfile import ModelFileError, ModelSpec, user_call

DTYPES = {"bf16": "native", "fp8": "fp8"}  # --dtype -> Settings.dtype_policy (weights and activations are bf16)
PREFILL_AXES, DECODE_AXES = ("batch", "input_len"), ("batch", "kv_len")
SAMPLE = {"batch": 3, "input_len": 7, "kv_len": 7}  # ≥ 2 (0 and 1 specialize) and distinct from each other
DECODE_SAMPLES = 17  # decode steps evaluated exactly; the sum over the others is interpolated (see decode_s)


class CapacityError(ModelFileError):
    """A model file or request capacity planning cannot serve (one line naming what is wrong)."""


@dataclass
class StepGraph:
    """One step lowered once (graph passes done); ``at(point)`` re-runs the bucket passes at the axes' values."""

    name: str
    template: Recipe
    ctx: LoweringContext
    lines: dict[str, tuple[int, dict[str, int]]]  # symbol -> (c, {axis: a}): value = c + Σ a * axis

    def env(self, point: Mapping[str, int]) -> dict[str, int]:
        return {s: c + sum(a * point[axis] for axis, a in coef.items()) for s, (c, coef) in self.lines.items()}

    def at(self, point: Mapping[str, int]) -> Recipe:
        return lower_bucket(self.template, self.ctx.at(self.env(point)))

    def time_s(self, point: Mapping[str, int]) -> float:
        return self.at(point).facts["cost"]["total_s"]

    def peak_bytes(self, point: Mapping[str, int]) -> int:
        """The planned peak HBM at ``point`` (the memory pass alone: what the batch search needs)."""
        return replanned_peak(self.template, self.env(point))


def step_graphs(spec: ModelSpec, target: str, dtype: str) -> tuple[StepGraph, StepGraph]:
    """The prefill and decode steps of a generative model file, lowered for ``target`` in ``dtype``."""
    if dtype not in DTYPES:
        raise CapacityError(f"dtype {dtype!r}: expected {' or '.join(DTYPES)}")
    if spec.decode is None:
        raise CapacityError(f"{spec.path}: no DECODE step; capacity planning needs a model file with a prefill "
                            f"step (AXES {', '.join(PREFILL_AXES)}) and DECODE (AXES {', '.join(DECODE_AXES)})")
    _require_axes(spec, PREFILL_AXES, "the prefill step")
    _require_axes(spec.decode, DECODE_AXES, "DECODE")
    return (trace_step(spec, "prefill", target, dtype), trace_step(spec.decode, "decode", target, dtype))


def _require_axes(spec: ModelSpec, axes: tuple[str, ...], what: str) -> None:
    if set(spec.axes) != set(axes):
        raise CapacityError(f"{spec.path}: {what} must have AXES {', '.join(axes)}; it has {', '.join(spec.axes)}")


def trace_step(spec: ModelSpec, name: str, target: str, dtype: str) -> StepGraph:
    """Build the step's model on the meta device, trace it on fake inputs and run the graph passes."""
    with torch.device("meta"):
        model = spec.build_model().eval().to(torch.bfloat16)
    point = {a: SAMPLE[a] for a in spec.axes}
    inputs = [_bf16(t) for t in spec.split(spec.inputs(point))]
    dims = _dim_lines(spec, point, inputs)
    gm = user_call(spec.path, "the model traced on fake inputs", trace_symbolic, model, inputs, dims)
    settings = Settings.from_options({**spec.options, "target": target, "cache": False, "execute": False,
                                      "dtype_policy": DTYPES[dtype]}, env={})
    ctx = LoweringContext(settings=settings, name=f"{spec.name}_{name}", kind="inference", gm=gm)
    template = lower(gm, ctx).template
    ctx = ctx.for_bucket({})  # the FX graph is not needed again; dropping it frees the tracer's memory
    first = len(template.inputs) - len(inputs)  # the graph's inputs: parameters and buffers, then the step's
    lines = {s: dims[(i - first, d)] for s, (i, d) in zip(template.symbols, template.symbol_sources)}
    return StepGraph(name, template, ctx, lines)


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
             batch: int | None = None) -> dict[str, Any]:
    """Per-step estimated time and HBM, the largest batch that fits and tokens/s; a JSON-ready dict."""
    if input_len < 1 or output_len < 1 or (batch is not None and batch < 1):
        raise CapacityError("input length, output length and batch must be positive integers")
    prefill, decode = step_graphs(spec, target, dtype)
    return plan_capacity(prefill, decode, spec.name, target, dtype, input_len, output_len, batch)


def plan_capacity(prefill: StepGraph, decode: StepGraph, model: str, target: str, dtype: str, input_len: int,
                  output_len: int, batch: int | None) -> dict[str, Any]:
    hbm = hbm_bytes(target)
    last_kv = input_len + output_len - 1

    def fits(b: int) -> bool:
        return (prefill.peak_bytes({"batch": b, "input_len": input_len}) <= hbm
                and decode.peak_bytes({"batch": b, "kv_len": last_kv}) <= hbm)

    largest, note = largest_fitting(fits)
    chosen = batch or largest
    doc = {"model": model, "target": target, "dtype": dtype, "estimate": True, "hbm_bytes": hbm,
           "input_len": input_len, "output_len": output_len,
           "max_batch": {"batch": largest, **({"note": note} if note else {}),
                         **({} if largest else {"reason": "even batch 1 does not fit"})},
           "batch": chosen, "steps": [], "tokens_per_s": None}
    if chosen:
        doc.update(throughput(prefill, decode, chosen, input_len, output_len))
    return doc


def throughput(prefill: StepGraph, decode: StepGraph, batch: int, input_len: int, output_len: int
               ) -> dict[str, Any]:
    """The steps at ``batch`` (prefill, first and last decode step) and tokens/s over the whole request."""
    points = decode_points(input_len, output_len)  # always holds the first and the last KV length
    steps = {kv: decode.at({"batch": batch, "kv_len": kv}) for kv, _ in points}
    rows = [_step_row("prefill", prefill.at({"batch": batch, "input_len": input_len}), input_len)]
    rows += [_step_row("decode", steps[kv], kv) for kv in sorted({input_len, input_len + output_len - 1})]
    decode_s = sum(w * steps[kv].facts["cost"]["total_s"] for kv, w in points)
    total_s = rows[0]["time_s"] + decode_s
    return {"steps": rows, "prefill_s": rows[0]["time_s"], "decode_s": decode_s, "total_s": total_s,
            "tokens_per_s": batch * output_len / total_s, "fits_hbm": all(r["fits_hbm"] for r in rows),
            "decode_sampled": len(points) < output_len, "decode_steps_evaluated": len(points)}


def _step_row(step: str, recipe: Recipe, length: int) -> dict[str, Any]:
    cost, memory = recipe.facts["cost"], recipe.facts["memory"]
    return {"step": step, "length": length, "time_s": cost["total_s"], "peak_hbm_bytes": memory["peak_bytes"],
            "input_bytes": memory["input_bytes"], "fits_hbm": memory["fits_hbm"],
            "bound": [c["bound"] for c in cost["clusters"]]}


__all__ = ["CapacityError", "DTYPES", "StepGraph", "capacity", "decode_points", "plan_capacity",
           "step_graphs", "throughput", "trace_step"]
