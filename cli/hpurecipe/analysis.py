"""Rendering of ``hpurecipe analyze`` (the analysis itself is ``hpu_backend.aot.analyze``)."""

from __future__ import annotations

from typing import Any

from . import render


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
    if mb:
        at = " ".join(f"{k}={v}" for k, v in mb["at"].items())
        where = f"{doc['target']} HBM" + (f" at {at}" if at else "")
        if mb.get("batch"):
            render.note("Largest batch that fits {}: {} (planned peak {}; an estimate).{}", where, f"{mb['batch']:,}",
                        render.size(mb["peak_bytes"]), f" {mb['note']}." if mb.get("note") else "")
        else:
            render.note("Largest batch that fits {}: cannot tell: {}.", where, mb["reason"])


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else render.duration(seconds)
