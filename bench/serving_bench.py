"""Warm-up time of the serving plan against vLLM-Gaudi's published warm-ups, and the planner's own speed.

Accuracy. One calibration row fits the two warm-up factors (hpu_backend/planning/serving/plan.py): vLLM-Gaudi's
docs/configuration/warm-up/managing_warm-up.md, LLaMA 3.1 8B, TP 1, bf16, with the bucket settings that page
gives and --max-model-len 8192: 66 s cold, 23 s from a recipe cache. The cached time less the buckets' run time
fits the bridge's factor per graph node; the cold time less the cached one fits the graph compiler's factor per
slice of work (of the distinct graphs: in bf16 the decoder layers after the first share one). Everything else is
held out and only reported: the fp8 row of the same page (504 s cold, 34 s cached; its graphs carry the quantize
and dequantize nodes INC adds and each layer's own scales, serving/fp8.py) and docs/features/warmup.md's
72 graphs in 49 s (Gaudi 2; prompt batches 1-4 × lengths 128-1024, decode batches 1-4 × lengths 128-2048, the older
per-sequence decode lengths here as blocks = batch × length / 128). Planned on gaudi2: neither page names
the card of its first rows.

Speed. A plan of LLaMA 3.1 70B on 8 cards over a 10,000-request Poisson trace, and of LLaMA 3.1 8B on one
(wall time and peak RSS of this process).

    python bench/serving_bench.py [--fit] [--quick]

--fit prints the factors the calibration row gives (to copy into plan.py). Writes
bench/results/serving_bench.json.
"""

from __future__ import annotations

import argparse
import resource
import time

from common import print_table, write_results

from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.planning.serving import buckets as bk
from hpu_backend.planning.serving import model as sm
from hpu_backend.planning.serving import plan as sp
from hpu_backend.planning.serving.trace import poisson

# managing_warm-up.md's grid, as that page's (older) linear generator built it: prompt batches 1, 2, 4, 8, 16, then
# by 32 to 256, lengths 128..1024 by 128, kept where batch x length <= 8192; decode batch 128 x blocks 128..1024
CALIBRATION_PROMPT = tuple((b, s, 0) for b in (1, 2, 4, 8, 16, *range(32, 257, 32)) for s in range(128, 1025, 128)
                           if b * s <= 8192)
CALIBRATION_DECODE = tuple((128, 1, k) for k in range(128, 1025, 128))
LLAMA_8B, LLAMA_70B = "models/llama.py:LLAMA31_8B", "models/llama.py:LLAMA31_70B"
GOAL = 0.35


def totals(model: sm.ServingModel, grid: bk.Grid, engine: bk.Engine) -> tuple[float, float, float]:
    """(Σ graph compiler work in slices, Σ graph nodes, Σ run seconds) over the grid's buckets."""
    work = nodes = run = 0.0
    for phase, shapes in (("prompt", grid.prompt), ("decode", grid.decode)):
        for bucket in shapes:
            work += model.bucket_value(phase, "slices", bucket, engine.block_size)
            nodes += model.bucket_value(phase, "nodes", bucket, engine.block_size)
            run += model.bucket_value(phase, "time_s", bucket, engine.block_size)
    return work, nodes, run


def row(name: str, dtype: str, engine: bk.Engine, grid_of, published: tuple[float, float], role: str,
        scale_patching: bool = False) -> dict:
    model = sm.load(load_model_file(LLAMA_8B), "gaudi2", dtype, 1, runtime_scale_patching=scale_patching)
    grid = grid_of(model, engine)
    model.fit((max(b for b, _, _ in grid.prompt), max(q for _, q, _ in grid.prompt)),
              (max(b for b, _, _ in grid.decode), max(k for _, _, k in grid.decode) * engine.block_size),
              engine.block_size)
    work, nodes, run = totals(model, grid, engine)
    return {"row": name, "role": role, "dtype": dtype, "graphs": grid.graphs, "work_slices": work,
            "graph_nodes": nodes, "run_s": run, "published_cold_s": published[0], "published_cached_s": published[1]}


def calibration_grid(model, engine):
    return bk.Grid("linear", CALIBRATION_PROMPT, CALIBRATION_DECODE)


def warmup_doc_grid(model, engine):
    prompt = tuple((b, s, 0) for b in (1, 2, 4) for s in range(128, 1025, 128))
    decode = tuple((b, 1, b * s // 128) for b in (1, 2, 4) for s in range(128, 2049, 128))
    return bk.Grid("linear", prompt, decode)


def accuracy() -> list[dict]:
    eng = bk.Engine(max_model_len=8192)
    rows = [row("LLaMA 3.1 8B bf16, 47 graphs (managing_warm-up.md)", "bf16", eng, calibration_grid, (66, 23),
                "calibration"),
            row("LLaMA 3.1 8B fp8, 47 graphs (managing_warm-up.md)", "fp8", eng, calibration_grid, (504, 34),
                "validation"),
            row("72 graphs on Gaudi 2 (warmup.md), bf16", "bf16", bk.Engine(max_model_len=4096, max_num_seqs=4),
                warmup_doc_grid, (49, None), "validation"),
            # supported_features.md: RUNTIME_SCALE_PATCHING=1 cuts fp8 warm-up "by up to 90%" (no absolute time)
            row("LLaMA 3.1 8B fp8, 47 graphs, RUNTIME_SCALE_PATCHING=1", "fp8", eng, calibration_grid, (504, 34),
                "what-if", scale_patching=True)]
    return rows


def fitted(calibration: dict) -> tuple[float, float]:
    """The two factors from the calibration row alone: (graph compiler s per slice, bridge s per node)."""
    cold, cached = calibration["published_cold_s"], calibration["published_cached_s"]
    return (cold - cached) / calibration["work_slices"], (cached - calibration["run_s"]) / calibration["graph_nodes"]


def predict(rows: list[dict], slice_k: float, node_k: float) -> None:
    for r in rows:
        r["cached_s"] = node_k * r["graph_nodes"] + r["run_s"]
        r["cold_s"] = slice_k * r["work_slices"] + r["cached_s"]
        r["cold_ratio"] = r["cold_s"] / r["published_cold_s"]
        r["cached_ratio"] = r["cached_s"] / r["published_cached_s"] if r["published_cached_s"] else None


def speed(spec_path: str, cards: int, requests: int) -> dict:
    start = time.perf_counter()
    model = sm.load(load_model_file(spec_path), "gaudi3", "bf16", cards)
    lowered = time.perf_counter() - start
    trace = poisson(requests, 20.0, (64, 2048), (16, 1024))
    doc = sp.plan(model, bk.Engine(max_model_len=4096), {}, trace, warmup_budget=600)
    seconds = time.perf_counter() - start
    return {"model": spec_path, "cards": cards, "requests": requests, "seconds": seconds, "lowering_s": lowered,
            "shapes_measured": model.measured, "graphs": doc["grid"]["graphs"],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="print the factors the calibration row gives")
    parser.add_argument("--quick", action="store_true", help="accuracy only, no speed runs")
    args = parser.parse_args()
    rows = accuracy()
    slice_k, node_k = fitted(rows[0])
    if args.fit:
        print(f"COMPILE_S_PER_SLICE = {slice_k:.3e}\nGRAPH_S_PER_NODE = {node_k:.3e}")
    predict(rows, sp.COMPILE_S_PER_SLICE, sp.GRAPH_S_PER_NODE)
    print_table("warm-up: estimate / published (plan.py factors)", ["row", "role", "graphs", "cold", "ratio",
                                                                      "cached", "ratio"],
                [[r["row"], r["role"], r["graphs"], f"{r['cold_s']:.0f} s / {r['published_cold_s']} s",
                  f"{r['cold_ratio']:.2f}", f"{r['cached_s']:.0f} s / {r['published_cached_s'] or '-'} s",
                  f"{r['cached_ratio']:.2f}" if r["cached_ratio"] else "-"] for r in rows])
    runs = [] if args.quick else [speed(LLAMA_70B, 8, 10_000), speed(LLAMA_8B, 1, 10_000)]
    for s in runs:
        print(f"{s['model']} on {s['cards']} cards, {s['requests']:,} requests: {s['seconds']:.1f} s "
              f"(lowering {s['lowering_s']:.1f} s, {s['shapes_measured']} shapes measured), "
              f"peak RSS {s['peak_rss_bytes'] / 2**30:.2f} GiB")
    write_results("serving_bench", {"factors": {"compile_s_per_slice": sp.COMPILE_S_PER_SLICE,
                                                "graph_s_per_node": sp.GRAPH_S_PER_NODE,
                                                "fitted": [slice_k, node_k]},
                                    "goal": GOAL, "rows": rows, "speed": runs})


if __name__ == "__main__":
    main()
