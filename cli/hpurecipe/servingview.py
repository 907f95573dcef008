"""Rendering of ``hpurecipe serving-plan`` (the plan itself is ``hpu_backend.planning.serving``)."""

from __future__ import annotations

from typing import Any

from . import render

SHOWN_UNWARMED = 10


def print_plan(doc: dict[str, Any], buckets: bool = False) -> None:
    mem, warm, grid = doc["memory"], doc["warmup"], doc["grid"]
    cards = f"{doc['cards']} × " if doc["cards"] > 1 else ""
    render.note("{} on {}{} in {}, max-model-len {}: {} buckets ({}, vllm-gaudi {}): {} prompt, {} decode "
                "(estimates).", doc["model"], cards, doc["target"], doc["dtype"], f"{doc['engine']['max_model_len']:,}",
                grid["graphs"], grid["strategy"], doc["vllm_gaudi"]["release"], len(grid["prompt"]),
                len(grid["decode"]))
    if grid["ignored_env"]:
        render.warn(f"the exponential strategy ignores {', '.join(grid['ignored_env'])} (as vLLM-Gaudi does); set "
                    "VLLM_BUCKETING_STRATEGY=lin to use them")
    render.table(["per card", "HBM"], [
        ["weights", render.size(mem["weights_bytes"])],
        [f"usable (gpu_memory_utilization {doc['engine']['gpu_memory_utilization']:g})",
         render.size(mem["usable_bytes"])],
        [f"kept for graphs (VLLM_GRAPH_RESERVED_MEM {doc['engine']['graph_reserved_mem']:g})",
         render.size(mem["graph_reserved_bytes"])],
        [f"KV cache: {mem['kv_blocks']:,} blocks of {doc['engine']['block_size']} tokens",
         render.size(mem["kv_cache_bytes"])],
        ["left for warm-up (activations and compiled graphs)", render.size(mem["warmup_room_bytes"])],
        [f"compiled graphs ({warm['graphs']} x 10 MiB)", render.size(warm["graph_bytes"])
         + ("" if warm["graph_memory_fits"] else " (past the graph reserve)")]],
        title=f"Memory on a {doc['target']} card ({render.size(mem['hbm_bytes'])})", right=("HBM",))
    render.note("At most {} sequences of {} tokens at once (KV cache and --max-num-seqs).",
                doc["max_concurrent_seqs"], f"{doc['engine']['max_model_len']:,}")
    print_oom(warm["steps"])
    phases = warm["phases"]
    render.table(["phase", "graphs", "warm-up cold", "from a recipe cache"],
                 [[p, phases[p]["graphs"], render.duration(phases[p]["cold_s"]), render.duration(phases[p]["cached_s"])]
                  for p in ("prompt", "decode")] + [["total", warm["graphs"], render.duration(warm["cold_s"]),
                                                     render.duration(warm["cached_s"])]],
                 title="Warm-up (compile-time model calibrated on one published row; see README)",
                 right=("graphs", "warm-up cold", "from a recipe cache"))
    print_autocalc(doc)
    if buckets:
        print_buckets(doc["buckets"])
    if "trace" in doc:
        print_trace(doc["trace"])


def print_autocalc(doc: dict[str, Any]) -> None:
    """Intel's autocalc (vllm-gaudi .cd/server/vllm_autocalc_rules.py) beside the plan."""
    auto, warm = doc["autocalc"], doc["warmup"]
    render.table(["", "autocalc", "this plan"], [
        ["graphs", f"{auto['graphs']:.0f}", warm["graphs"]],
        ["graph memory", render.size(auto["graph_memory_bytes"]), render.size(warm["graph_bytes"])],
        ["VLLM_GRAPH_RESERVED_MEM", f"{auto['VLLM_GRAPH_RESERVED_MEM']:g}", f"{doc['engine']['graph_reserved_mem']:g}"],
        ["max_num_seqs", auto["max_num_seqs"], doc["engine"]["max_num_seqs"]]],
        title="Intel's autocalc (vllm_autocalc_rules.py) beside this plan", right=("autocalc", "this plan"))
    for note in auto["differences"]:
        render.note("{}.", note)


def print_oom(steps: dict[str, Any]) -> None:
    """The first warm-up step that runs out of memory, or that every step fits."""
    oom = steps["first_oom"]
    if oom is None:
        render.note("Every warm-up step fits ({} checked, in vLLM-Gaudi's order).", steps["steps_checked"])
        return
    where = f"warm-up step {oom['index'] + 1} of {steps['total']}, {oom['step']}" if "index" in oom else oom["step"]
    held = f" with {render.size(oom['graphs_bytes'])} of graphs held" if "graphs_bytes" in oom else ""
    render.warn(f"out of memory at {where}: needs {render.size(oom['need_bytes'])}{held}, "
                f"{render.size(oom['room_bytes'])} left; {oom['change']}")


def print_buckets(rows: list[dict[str, Any]]) -> None:
    head = ["phase", "batch", "query", "blocks", "est. step", "activations", "warm-up cold", "cached"]
    render.table(head, [[r["phase"], *r["bucket"], _t(r["time_s"]), render.size(r["activation_bytes"]),
                         _t(r["cold_s"]), _t(r["cached_s"])] for r in rows],
                 title="Buckets in warm-up order (batch, query tokens, context or KV blocks; activations: the memory "
                       "plan's arena)", right=tuple(head[1:]))


def print_trace(t: dict[str, Any]) -> None:
    runs = [("default", t["default"])] + ([("recommended", t["recommended"])] if "seconds" in t.get("recommended", {})
                                          else [])
    render.table(["grid", "tokens/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "padding", "unwarmed",
                  "preempted"],
                 [[name, f"{r['tokens_per_s']:,.0f}", _t(r["ttft_s"]["p50"]), _t(r["ttft_s"]["p99"]),
                   _t(r["tpot_s"]["p50"]), _t(r["tpot_s"]["p99"]), f"{r['padding_waste']:.1%}", len(r["unwarmed"]),
                   r["preemptions"]] for name, r in runs],
                 title=f"Serving {t['requests']:,} requests (continuous batching, estimates)",
                 right=("tokens/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "padding", "unwarmed",
                        "preempted"))
    unwarmed = t["default"]["unwarmed"]
    for u in unwarmed[:SHOWN_UNWARMED]:
        render.note("recompile after warm-up: {} {} ({} steps, first at {}): compiles for {}; {}.", u["phase"],
                    "x".join(map(str, u["shape"])), u["steps"], render.duration(u["first_at_s"]),
                    render.duration(u["compile_s"]), u.get("why", ""))
    if len(unwarmed) > SHOWN_UNWARMED:
        render.note("... and {} more shapes outside the grid (--json lists them all).", len(unwarmed) - SHOWN_UNWARMED)
    rec = t.get("recommended")
    if rec and "env" in rec:
        w = rec["warmup"]
        render.note("Recommended for this trace ({} buckets, warm-up {} cold within --warmup-budget {}):",
                    w["graphs"], render.duration(w["cold_s"]), render.duration(rec["budget_s"]))
        for name, value in rec["env"].items():
            render.console.print(f"export {name}={value}", highlight=False, soft_wrap=True)
    elif rec:
        render.note("No recommendation: {}.", rec["reason"])


def _t(seconds: float | None) -> str:
    return "-" if seconds is None else render.duration(seconds)
