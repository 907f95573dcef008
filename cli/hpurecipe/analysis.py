"""Rendering of ``hpurecipe analyze`` (the analysis itself is ``hpu_backend.aot.analyze``, and
``hpu_backend.aot.capacity`` with --input-len/--output-len)."""

from __future__ import annotations

from typing import Any

from . import render


def print_analysis(doc: dict[str, Any]) -> None:
    render.table(["point", "planned at", "recipes", "fallbacks", "graph breaks", "recompilations", "est. time",
                  "peak HBM"],
                 ([r["bucket"], render.point(r["planned_at"]), r["recipes"], r["fallbacks"], r["graph_breaks"],
                   r["recompilations"],
                   _time(r["time_s"]), render.size(r["peak_hbm_bytes"]) + ("" if r["fits_hbm"] else " (does not fit)")]
                  for r in doc["buckets"]),
                 title=f"{doc['model']} ({doc['mode']}) on {doc['target']}, {render.size(doc['hbm_bytes'])} HBM",
                 right=("recipes", "fallbacks", "graph breaks", "recompilations", "est. time", "peak HBM"))
    if any(r["planned_at"] != r["point"] for r in doc["buckets"]):
        render.note("Estimates are planned at the upper end of each point's bucket ('planned at'): the recipe that "
                    "serves every size in the bucket.")
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
    return render.duration(seconds)


def print_capacity(doc: dict[str, Any]) -> None:
    """The steps at the chosen batch, the largest batch that fits and tokens/s (all estimates)."""
    b = doc["batch"]
    if b:
        render.table(["step", "batch", "length", "est. time", "peak HBM"],
                     ([r["step"], f"{b:,}", f"{'input' if r['step'] == 'prefill' else 'KV'} {r['length']:,}",
                       _time(r["time_s"]), render.size(r["peak_hbm_bytes"]) + ("" if r["fits_hbm"] else " (does not fit)")]
                      for r in doc["steps"]),
                     title=f"{doc['model']} on {doc['target']} in {doc['dtype']}, {render.size(doc['hbm_bytes'])} HBM "
                           f"(estimates)", right=("batch", "length", "est. time", "peak HBM"))
    mb, sizes = doc["max_batch"], f"input {doc['input_len']:,} + output {doc['output_len']:,} tokens"
    if mb["batch"]:
        render.note("Largest batch that fits {} HBM at {} (KV cache included): {}.{}", doc["target"], sizes,
                    f"{mb['batch']:,}", f" {mb['note']}." if mb.get("note") else "")
    else:
        render.note("Does not fit {} HBM even at batch 1 at {}.", doc["target"], sizes)
    if b:
        sampled = (f"; {doc['decode_steps_evaluated']} decode steps evaluated, the rest interpolated"
                   if doc["decode_sampled"] else "")
        render.note("At batch {}: {} tokens/s (prefill {} + {} decode steps {}{}){}.", f"{b:,}",
                    f"{doc['tokens_per_s']:,.0f}", _time(doc["prefill_s"]), f"{doc['output_len']:,}",
                    _time(doc["decode_s"]), sampled, "" if doc["fits_hbm"] else "; it does not fit in HBM")
