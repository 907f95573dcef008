"""Lowering time vs AOTAutograd trace time for models/gpt.py at 2, 8 and 32 layers (training graphs).

For each depth, a Dynamo backend times ``aot_autograd`` tracing the forward and backward graphs
(with the HPU decomposition table and trivial graph compilers), then times, on each traced graph,
``capture`` and every lowering pass: the graph passes once and the bucket passes for the one
(static) bucket. The target is lowering ≤ 10% of the trace time, growing linearly with depth.

    python bench/lowering_bench.py [--quick] [--layers 2 8 32] [--seq 128] [--repeat 3]

Writes bench/results/lowering_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from hpu_backend.capture.decompositions import hpu_decompositions
from hpu_backend.lowering import BUCKET_PASSES, GRAPH_PASSES, LoweringContext, capture_graph
from hpu_backend.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "lowering_bench.json"


def _load_gpt():
    spec = importlib.util.spec_from_file_location("bench_gpt", ROOT / "models" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace(model, tokens) -> tuple[float, dict]:
    """AOTAutograd trace seconds for forward + backward, and the traced aten graphs by kind."""
    graphs, spent = {}, {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm)
        return compiler

    def backend(gm, example_inputs):
        start = time.perf_counter()
        out = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           decompositions=hpu_decompositions())(gm, example_inputs)
        spent["s"] = time.perf_counter() - start
        return out

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    compiled(tokens).sum().backward()  # the backward compiler runs lazily, on the first backward
    return spent["s"], graphs


def lower(gm, kind: str) -> dict[str, float]:
    """Seconds of capture and of each lowering pass on one traced graph."""
    ctx = LoweringContext(settings=Settings.from_options({"cache": False}, env={}), name=f"bench_{kind}",
                          kind=kind, gm=gm)
    times = {}
    start = time.perf_counter()
    recipe = capture_graph(gm, ctx)
    times["capture"] = time.perf_counter() - start
    for p in [*GRAPH_PASSES, *BUCKET_PASSES]:
        start = time.perf_counter()
        recipe = p(recipe, ctx)
        times[p.__name__] = time.perf_counter() - start
    times["nodes"] = len(recipe.nodes)
    return times


def measure(layers: int, seq: int, repeat: int) -> dict:
    gpt = _load_gpt()
    model = gpt.make_model(layers=layers)
    tokens, _ = gpt.make_inputs(2, seq)
    runs = []
    for _ in range(repeat):
        trace_s, graphs = trace(model, tokens)
        per_graph = {kind: lower(gm, kind) for kind, gm in graphs.items()}
        runs.append((trace_s, per_graph))
    trace_s = statistics.median(r[0] for r in runs)
    passes = [p.__name__ for p in [*GRAPH_PASSES, *BUCKET_PASSES]]
    per_pass = {p: statistics.median(sum(g[p] for g in r[1].values()) for r in runs) for p in ["capture", *passes]}
    lowering_s = sum(per_pass[p] for p in passes)
    return {"layers": layers, "seq": seq, "nodes": sum(g["nodes"] for g in runs[0][1].values()),
            "trace_ms": trace_s * 1e3, "capture_ms": per_pass["capture"] * 1e3, "lowering_ms": lowering_s * 1e3,
            "lowering_pct_of_trace": 100 * lowering_s / trace_s,
            "per_pass_ms": {p: v * 1e3 for p, v in per_pass.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 and 8 layers, one run each")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.out is None:  # a quick (smoke) run never overwrites the full results
        full = RESULTS
        args.out = full.with_name(full.stem + "_quick.json") if args.quick else full
    layers, repeat = ([2, 8], 1) if args.quick else (args.layers, args.repeat)
    rows = [measure(n, args.seq, repeat) for n in layers]
    print(f"{'layers':>6} {'nodes':>6} {'trace ms':>9} {'capture ms':>10} {'lowering ms':>11} {'% of trace':>10}")
    for r in rows:
        print(f"{r['layers']:>6} {r['nodes']:>6} {r['trace_ms']:>9.1f} {r['capture_ms']:>10.1f} "
              f"{r['lowering_ms']:>11.1f} {r['lowering_pct_of_trace']:>9.1f}%")
    slowest = max(rows, key=lambda r: r["layers"])
    print("per pass at", slowest["layers"], "layers (ms):",
          ", ".join(f"{k} {v:.1f}" for k, v in slowest["per_pass_ms"].items()))
    doc = {"bench": "lowering", "torch": torch.__version__, "python": platform.python_version(),
           "machine": platform.machine(), "quick": args.quick, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
