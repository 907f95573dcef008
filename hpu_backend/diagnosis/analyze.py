"""A model file's buckets analyzed (what ``hpurecipe analyze`` prints): per bucket fallbacks, graph breaks,
recompilations, estimated time and HBM, and the largest batch that fits; a JSON-ready dict.

It compiles each bucket (compile-only, no cache) and reads each recipe through
``hpu_backend.diagnosis.report.GraphReport`` (the same reading as ``hpu_backend.analyze()``); graph breaks
per bucket are the Dynamo graphs it ran beyond the first, recompilations the graphs a guard
failure compiled (``recompiles`` explains each: guard, cause, value, source line), and the graph-break
reasons come from ``torch._dynamo.explain`` at the first bucket.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any, Callable


from .. import metrics
from ..errors import first_line
from .report import GraphReport
from ..modelfiles.modelspec import ModelSpec, model_call, point_label
from .step_memory import StepState, step_state
from ..shipping.warm import PointResult, plan, plan_lazy



def analyze_spec(spec: ModelSpec, target: str, train: bool,
                 on_point: Callable[[PointResult], None] | None = None, lazy: bool = False) -> dict[str, Any]:
    """The analysis of every point of ``spec`` on ``target``; ``on_point`` is called as each point is planned."""
    if lazy:
        return _analyze_lazy(spec, target, train, on_point)
    breaks = _graph_breaks(spec, train)
    seen = len(metrics.recompiles())
    points = plan(spec, train=train, target=target, on_point=on_point)
    recompiles = metrics.recompiles()[seen:]
    rows = [_row(p) for p in points]
    hbm = hbm_bytes(target)
    return {"model": spec.name, "target": target, "mode": "train" if train else "inference",
            "hbm_bytes": hbm, "graph_break_reasons": breaks, "buckets": rows,
            "recompiles": recompiles,
            "max_batch": _max_batch(spec, points, hbm, train, target)}


def _analyze_lazy(spec: ModelSpec, target: str, train: bool,
                  on_point: Callable[[PointResult], None] | None = None) -> dict[str, Any]:
    """The same report for the model run eagerly in lazy mode: its lazy graphs' recipes per point. Lazy graphs
    are static (one recipe per shape), so no batch search, and neither graph breaks nor recompiles apply."""
    rows = [_row(p) for p in plan_lazy(spec, train=train, target=target, on_point=on_point)]
    return {"model": spec.name, "target": target, "mode": ("train" if train else "inference") + ", lazy", "lazy": True,
            "hbm_bytes": hbm_bytes(target), "graph_break_reasons": [], "buckets": rows, "recompiles": [],
            "max_batch": None}


def _row(p: PointResult) -> dict[str, Any]:
    graphs = [GraphReport.from_recipe(u.recipe) for u in p.used]
    frames = {g.name.rsplit("_", 1)[0] for g in graphs}
    new_frames = {u.graph.rsplit("_", 1)[0] for u in p.used if u.compiled_for == "guard failure"}
    return {"bucket": p.label, "point": p.point, "planned_at": planned_at(p), "recipes": len(p.keys),
            "fallbacks": sum(len(g.fallbacks) for g in graphs),
            "fallback_ops": sorted({fb["op"] for g in graphs for fb in g.fallbacks}),
            "graphs": [asdict(g) for g in graphs], "graph_breaks": max(len(frames) - 1, 0),
            "recompilations": len(new_frames), "time_s": sum(g.est_time_s for g in graphs),
            "peak_hbm_bytes": max((g.est_peak_bytes for g in graphs), default=0),
            "fits_hbm": all(g.fits_hbm for g in graphs)}


def planned_at(p: PointResult) -> dict[str, int]:
    """The point a row's estimates are planned at: each recipe is planned at its bucket's upper end, so an
    axis whose value a shape symbol carries reads that symbol's planned value (the largest over the graphs);
    an axis no symbol carries alone (static, or shared with another axis's value) keeps the point's value."""
    planned = dict(p.point)
    for u in p.used:
        for sym, value in u.env.items():
            axes = [a for a, v in p.point.items() if v == value]
            at = u.recipe.facts.get("plan_at", {}).get(sym)
            if len(axes) == 1 and at is not None:
                planned[axes[0]] = max(at, planned[axes[0]])
    return planned


def _graph_breaks(spec: ModelSpec, train: bool) -> list[str]:
    """Dynamo's reasons for breaking the graph, at the first point (torch._dynamo.explain)."""
    import torch._dynamo

    model = spec.build_model().train(train)
    point = spec.points()[0]
    inputs = spec.split(spec.inputs(point))
    with torch.no_grad():
        out = model_call(spec.path, f"the model at {point_label(point)}", torch._dynamo.explain(model), *inputs,
                         eager=model)
    torch._dynamo.reset()
    return sorted({first_line(getattr(b, "reason", b)) for b in out.break_reasons})


def hbm_bytes(target: str) -> int:
    from ..targets import device

    return int(device(target).hbm_bytes)


MAX_SEARCH_BATCH = 1 << 31


def _max_batch(spec: ModelSpec, points: list[PointResult], hbm: int, train: bool, target: str
               ) -> dict[str, Any] | None:
    """The largest batch whose planned peak HBM fits ``hbm`` (other axes at their largest), found by
    evaluating the graphs' memory plans at candidate batch sizes; ``batch`` None with the reason when
    that cannot be done. Each graph's symbols are matched to the batch from two batch sizes of at least
    2 (Dynamo specializes a size of 1): two of AXES, else two probes compiled here (compile-only). In
    training the whole step is planned: its graphs plus gradients, optimizer state and master weights
    (``step_memory``), for every model file."""
    if "batch" not in spec.axes:
        return None
    others = {a: max(v) for a, v in spec.axes.items() if a != "batch"}
    pair = _same_graphs([p for p in points if all(p.point[a] == v for a, v in others.items())])
    if pair is None:
        b = max(2, *spec.axes["batch"])
        pair = _same_graphs(plan(spec.with_axes({"batch": [b, b + 1], **{a: [v] for a, v in others.items()}}),
                                 train=train, target=target))
    if pair is None:
        return {"batch": None, "at": others, "reason": "Dynamo compiled a separate graph for each batch size "
                "tried; compile with dynamic shapes (COMPILE = {\"dynamic\": True, ...}) to let analyze search"}
    p0, p1 = pair
    b0, b1 = p0.point["batch"], p1.point["batch"]
    scaled = _scaled_graphs(p0, p1, b0, b1)
    if scaled is None:
        return {"batch": None, "at": others, "reason": "no graph has a shape that follows the batch (static "
                "graphs: compile with dynamic shapes, COMPILE = {\"dynamic\": True, ...})"}

    state = step_state(spec) if train else None
    step = {"step": state.to_dict()} if state else {}

    def fits(batch: int) -> bool:
        return _peak_at(scaled, batch, state) <= hbm

    batch, note = largest_fitting(fits, max(b1, 2))
    if not batch:
        return {"batch": 0, "at": others, "reason": "even batch 1 does not fit", **step}
    return {"batch": batch, "at": others, "peak_bytes": _peak_at(scaled, batch, state),
            **({"note": note} if note else {}), **step}


def largest_fitting(fits, start: int = 2) -> tuple[int, str]:
    """(the largest batch for which ``fits(batch)``, a note) by doubling from ``start`` until it does not fit,
    then bisecting; (0, "") when even batch 1 does not fit. ``fits`` must be monotone (more batch, more HBM)."""
    if not fits(1):
        return 0, ""
    lo, hi = 1, max(start, 2)
    while fits(hi):  # grow until it no longer fits
        lo, hi = hi, hi * 2
        if hi > MAX_SEARCH_BATCH:
            return lo, f"fits at every batch searched (up to {lo:,})"
    while hi - lo > 1:  # largest lo that fits, smallest hi that does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, ""


def _same_graphs(points: list[PointResult]) -> tuple[PointResult, PointResult] | None:
    """The point with the largest batch and the next smaller one (≥ 2) that ran the same graphs."""
    ranked = sorted((p for p in points if p.point["batch"] >= 2), key=lambda p: -p.point["batch"])
    if not ranked:
        return None
    top = ranked[0]
    graphs = {u.graph for u in top.used}
    return next(((p, top) for p in ranked[1:] if p.point["batch"] < top.point["batch"]
                 and {u.graph for u in p.used} == graphs), None)


def _scaled_graphs(p0: PointResult, p1: PointResult, b0: int, b1: int) -> list | None:
    """(recipe, {symbol: (a, c)}) per graph used at both points, each symbol's value being a*batch + c
    (integers; a = 0 for a symbol that does not follow the batch); None if no symbol follows it."""
    first = {u.graph: u.env for u in p0.used}
    out, follows = [], False
    for u in p1.used:
        recipe, env1, env0 = u.recipe, u.env, first.get(u.graph)
        if env0 is None or set(env0) != set(env1):
            continue
        lines = {}
        for sym, v1 in env1.items():
            a, rest = divmod(v1 - env0[sym], b1 - b0)
            if rest:
                return None  # not a whole multiple of the batch: not a shape we can extrapolate
            lines[sym] = (a, env0[sym] - a * b0)
            follows = follows or a != 0
        out.append((recipe, lines))
    return out if follows else None


def _peak_at(scaled: list, batch: int, state: StepState | None = None) -> int:
    """The largest planned peak HBM of the graphs with their symbols at this batch (memory pass re-run); with
    a training ``state``, the whole step's peak."""
    peaks = [(recipe.kind, replanned_peak(recipe, {s: a * batch + c for s, (a, c) in lines.items()}))
             for recipe, lines in scaled]
    if state is not None:
        return state.peak(peaks)
    return max((p for _, p in peaks), default=0)


def replanned_peak(recipe, env: dict[str, int]) -> int:
    """The planned peak HBM of a lowered recipe with its symbols at ``env`` (only the memory pass re-run)."""
    from ..lowering.passes.plan_memory import plan_memory

    planned = plan_memory(dataclasses.replace(recipe, facts=dict(recipe.facts, plan_at=env)), None)
    return planned.facts["memory"]["peak_bytes"]
