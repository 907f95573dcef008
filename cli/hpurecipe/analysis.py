"""``hpurecipe analyze``: per-bucket fallbacks, graph breaks, recompilations, time and HBM, from a model's recipes.

It compiles each bucket (compile-only, no cache) and reads each recipe through
``hpu_backend.analysis.GraphReport`` (the same reading as ``hpu_backend.analyze()``); graph breaks
per bucket are the Dynamo graphs it ran beyond the first, recompilations the graphs a guard
failure compiled, and the reasons come from ``torch._dynamo.explain`` at the first bucket.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any


from hpu_backend.analysis import GraphReport
from hpu_backend.modelfile import ModelSpec
from hpu_backend.aot.warm import PointResult, plan

from . import render

HBM_BYTES = {"gaudi2": 96 * 1024**3, "gaudi3": 128 * 1024**3}  # used when lowering has no device table


def analyze_spec(spec: ModelSpec, target: str, train: bool) -> dict[str, Any]:
    breaks = _graph_breaks(spec, train)
    points = plan(spec, train=train, target=target)
    rows = [_row(p) for p in points]
    hbm = _hbm_bytes(target)
    return {"model": spec.name, "target": target, "mode": "train" if train else "inference",
            "hbm_bytes": hbm, "graph_break_reasons": breaks, "buckets": rows,
            "max_batch": _max_batch(spec, rows, hbm)}


def _row(p: PointResult) -> dict[str, Any]:
    graphs = [GraphReport.from_recipe(r) for _, r in getattr(p, "used", [])]
    frames = {g.name.rsplit("_", 1)[0] for g in graphs}
    new_frames = {g.ctx.name.rsplit("_", 1)[0] for g, r in getattr(p, "used", [])
                  if g.first_reason == "guard failure" and _is_first(g, r)}
    return {"bucket": p.label, "point": p.point, "recipes": len(p.keys),
            "fallbacks": sum(len(g.fallbacks) for g in graphs),
            "fallback_ops": sorted({fb["op"] for g in graphs for fb in g.fallbacks}),
            "graphs": [asdict(g) for g in graphs], "graph_breaks": max(len(frames) - 1, 0),
            "recompilations": len(new_frames), "time_s": sum(g.est_time_s for g in graphs),
            "peak_hbm_bytes": max((g.est_peak_bytes for g in graphs), default=0),
            "fits_hbm": all(g.fits_hbm for g in graphs)}


def _is_first(graph, recipe) -> bool:
    """The recipe that made the graph compile (its first)."""
    return next(iter(graph.recipes.values()), None) is recipe


def _graph_breaks(spec: ModelSpec, train: bool) -> list[str]:
    """Dynamo's reasons for breaking the graph, at the first point (torch._dynamo.explain)."""
    import torch._dynamo

    model = spec.build_model().train(train)
    inputs = spec.split(spec.inputs(spec.points()[0]))
    with torch.no_grad():
        out = torch._dynamo.explain(model)(*inputs)
    torch._dynamo.reset()
    return sorted({str(getattr(b, "reason", b)).splitlines()[0] for b in out.break_reasons})


def _hbm_bytes(target: str) -> int:
    try:
        from hpu_backend.lowering.devices import device
    except ImportError:
        return HBM_BYTES[target]
    return int(device(target).hbm_bytes)


def _max_batch(spec: ModelSpec, rows: list[dict], hbm: int) -> dict[str, Any] | None:
    """Extrapolate peak HBM linearly in ``batch`` (other axes at their largest) to the target's capacity.

    Memory is planned at each bucket's upper end, so this errs on the small side.
    """
    if "batch" not in spec.axes:
        return None
    others = {a: max(v) for a, v in spec.axes.items() if a != "batch"}
    pts = sorted((r["point"]["batch"], r["peak_hbm_bytes"]) for r in rows
                 if r["peak_hbm_bytes"] is not None and all(r["point"][a] == v for a, v in others.items()))
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return None
    (b0, p0), (b1, p1) = pts[0], pts[-1]
    slope = (p1 - p0) / (b1 - b0)
    if slope <= 0:
        return {"batch": None, "at": others, "bytes_per_sample": slope, "note": "memory does not grow with batch"}
    return {"batch": int(math.floor((hbm - (p0 - slope * b0)) / slope)), "at": others, "bytes_per_sample": slope}


def print_analysis(doc: dict[str, Any]) -> None:
    render.table(["bucket", "recipes", "fallbacks", "graph breaks", "recompilations", "est. time", "peak HBM"],
                 ([r["bucket"], r["recipes"], r["fallbacks"], r["graph_breaks"], r["recompilations"],
                   _time(r["time_s"]), render.size(r["peak_hbm_bytes"]) + ("" if r["fits_hbm"] else " (does not fit)")]
                  for r in doc["buckets"]),
                 title=f"{doc['model']} ({doc['mode']}) on {doc['target']}, {render.size(doc['hbm_bytes'])} HBM",
                 right=("recipes", "fallbacks", "graph breaks", "recompilations", "est. time", "peak HBM"))
    ops = sorted({op for r in doc["buckets"] for op in r["fallback_ops"]})
    if ops:
        render.note("CPU fallback ops: {}", ", ".join(ops))
    for reason in doc["graph_break_reasons"]:
        render.note("graph break: {}", reason)
    mb = doc["max_batch"]
    if mb and mb.get("batch") is not None:
        at = " ".join(f"{k}={v}" for k, v in mb["at"].items())
        render.note("Largest batch that fits {} HBM{}: about {} ({} per sample, estimated).", doc["target"],
                    f" at {at}" if at else "", mb["batch"], render.size(mb["bytes_per_sample"]))


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else render.duration(seconds)
