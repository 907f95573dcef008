"""Rendering of ``hpurecipe analyze`` (the analysis itself is ``hpu_backend.diagnosis.analyze``, and
``hpu_backend.planning.capacity`` with --input-len/--output-len)."""

from __future__ import annotations

from typing import Any

from . import render


def _step(state: dict | None) -> str:
    """The whole training step's state the batch search counted, as one sentence (nothing for inference)."""
    if not state:
        return ""
    return (f" The whole step: parameters {render.size(state['parameters'])}, gradients "
            f"{render.size(state['gradients'])}, optimizer state {render.size(state['optimizer_state'])} "
            f"({state['optimizer']}{', assumed: the model file names no optimizer' if state.get('assumed') else ''}), "
            f"master weights {render.size(state['master_weights'])}.")


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
    for r in doc.get("recompiles", []):
        render.note("recompile: {}", f"{r['function']}: {r['cause']} ({r['variable']} {r['change']}".rstrip()
                    + f") at {r['source']}" + (f" (in library code: {r['library']})" if r.get("library") else "")
                    + f"; guard {r['guard']}")
    mb = doc["max_batch"]
    if mb:
        at = " ".join(f"{k}={v}" for k, v in mb["at"].items())
        where = f"{doc['target']} HBM" + (f" at {at}" if at else "")
        if mb.get("batch"):
            render.note("Largest batch that fits {}: {} (planned peak {}; an estimate).{}{}", where, f"{mb['batch']:,}",
                        render.size(mb["peak_bytes"]), f" {mb['note']}." if mb.get("note") else "",
                        _step(mb.get("step")))
        else:
            render.note("Largest batch that fits {}: cannot tell: {}.", where, mb["reason"])


def print_advice(doc: dict[str, Any]) -> None:
    at = " ".join(f"{k}={v}" for k, v in doc["planned_at"].items())
    found = doc["findings"]
    render.table(["#", "check", "where", "est. gain", "finding"],
                 ([i + 1, f["check"], f["where"], _time(f["gain_s"]), f["what"]] for i, f in enumerate(found)),
                 title=f"{doc['model']} ({doc['mode']}) on {doc['target']}, planned at {at or 'its shapes'}: "
                       f"{len(found)} findings, most valuable first",
                 right=("#", "est. gain"))
    for i, f in enumerate(found):
        render.note("{}. {}: {}" + (" Fix: {}." if f["fix"] else ""), i + 1, f["check"], f["why"],
                    *([f["fix"]] if f["fix"] else []))
    render.note("Gains are estimates of device time per step from the cost model; '-' where it has none.")


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
                       _time(r["time_s"]),
                       render.size(r["peak_hbm_bytes"]) + ("" if r["fits_hbm"] else " (does not fit)")]
                      for r in doc["steps"]),
                     title=f"{doc['model']} on {_cards(doc)}{doc['target']} in {doc['dtype']}, "
                           f"{render.size(doc['hbm_bytes'])} HBM{' per card' if doc['cards'] > 1 else ''} (estimates)",
                     right=("batch", "length", "est. time", "peak HBM"))
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
        if doc["cards"] == 1:  # one card has no collectives: a "0.0%" line would say nothing
            render.note("First token after {}.", _time(doc["first_token_s"]))
        else:
            render.note("First token after {}; collectives {} of the time ({} not hidden behind compute).",
                        _time(doc["first_token_s"]), f"{doc['comm_share']:.1%}", _time(doc["exposed_comm_s"]))
        if doc["cards"] > 1:
            parts = (f"{k.removesuffix('_bytes').replace('_', ' ')} {render.size(v)}"
                     for k, v in doc["hbm_per_card"].items())
            render.note("HBM per card at the last step: {}.", ", ".join(parts))


def _cards(doc: dict[str, Any]) -> str:
    return f"{doc['cards']} × " if doc.get("cards", 1) > 1 else ""


def print_training(doc: dict[str, Any]) -> None:
    """One training step: layout, per-card memory by category, tokens/s and samples/s (all estimates)."""
    lay = doc["layout"]
    where = (f"{doc['model']} training on {_cards(doc)}{doc['target']} in {doc['dtype']}, seq {doc['seq']:,}, "
             f"global batch {doc['global_batch']:,}")
    render.note("{}: {} data-parallel × {} tensor-parallel, ZeRO {}, checkpointing {}, buckets {} MB (estimates).",
                where, lay["dp"], lay["tp"], lay["zero"], lay["checkpointing"], f"{lay['bucket_mb']:g}")
    mb = doc["max_batch"]
    if not doc["memory"]:
        render.note("Does not fit {} HBM even at micro-batch 1: {}.", doc["target"], mb.get("reason", ""))
        return
    render.table(["per card", "HBM"], ([k.removesuffix("_bytes").replace("_", " "), render.size(v)]
                                       for k, v in doc["memory"].items()),
                 title=f"HBM per card at micro-batch {doc['batch']:,} ({render.size(doc['hbm_bytes'])})",
                 right=("HBM",))
    render.note("Largest micro-batch that fits: {}; {} micro-steps of {} per card per step. {}.",
                f"{mb['batch']:,}", lay["accumulation"], lay["micro_batch"],
                "It fits" if doc["fits_hbm"] else "It does NOT fit")
    step = doc["step"]
    render.note("{} tokens/s, {} samples/s; step {} (optimizer {}); {} collectives a step, communication {} of "
                "the step not hidden.", f"{doc['tokens_per_s']:,.0f}", f"{doc['samples_per_s']:,.1f}",
                _time(doc["step_s"]), _time(step["optimizer_s"]), f"{doc['collectives_per_step']:,}",
                f"{doc['comm_share']:.1%}")
    if doc.get("search"):
        render.note("Searched {} layouts; the fastest that fits is shown.", len(doc["search"]))
