"""Calibrate and check the cost model against Intel's published LLaMA 2 7B numbers (capacity planning).

LLaMA 2 7B (models/llama.py:LLAMA2_7B, built on the meta device: no weights) is lowered once per target in
fp8; every published row is then estimated by re-planning the prefill and decode steps at its sizes
(``hpu_backend.planning.capacity``). Each estimated step is a sum over clusters of max(MME, TPC, HBM time) +
launch, so its raw terms (at efficiency 1) give the estimate at any efficiency factors without lowering
again. The fit: the MME and HBM factors on a 0.01 grid in [0.20, 1.00] that minimize the largest
|log(estimate / published)| over the six Gaudi 2 rows (TPC set to the MME factor: TPC work is a few percent
of these rows; see devices.EFFICIENCY). Gaudi 3 rows are not fitted: they check that the same factors carry
over to another target.

    python bench/capacity_bench.py [--no-gaudi3] [--quick]

Prints estimate / published per row (at the factors in hpu_backend/targets.py, and at the fitted
ones), writes bench/results/capacity_bench.json and, with matplotlib, bench/results/capacity_bench.png.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

from common import ROOT, print_table, ratio_plot, write_results

from hpu_backend.planning.capacity import decode_points, step_graphs
from hpu_backend.targets import EFFICIENCY
from hpu_backend.modelfiles.modelfile import load_model_file

SOURCE_G2 = "Intel, Model Performance Data for Intel Gaudi 2 AI Accelerators (software 1.18.0), LLaMA 2 7B fp8, 1 HPU"
SOURCE_G3 = "Intel, Model Performance Data for Intel Gaudi 3 AI Accelerators (software 1.18.0), LLaMA 2 7B fp8, 1 HPU"
# (kind, input, output, batch, published): tokens/s for "throughput", milliseconds for "latency" (batch 1,
# read as the time of the prefill step: the first token).
ROWS = {
    "gaudi2": [("throughput", 128, 128, 1230, 13137), ("throughput", 128, 2048, 163, 4791),
               ("throughput", 2048, 128, 94, 1449), ("throughput", 2048, 2048, 81, 1953),
               ("latency", 128, 1, 1, 7.62), ("latency", 2048, 1, 1, 56.31)],
    "gaudi3": [("throughput", 128, 128, 1536, 19810), ("throughput", 128, 2048, 217, 6763),
               ("throughput", 2048, 128, 153, 2029), ("throughput", 2048, 2048, 75, 2734)],
}
GOAL = 0.35  # every row within ±35%


def raw_terms(recipe) -> list[tuple[float, float, float, float]]:
    """(MME, TPC, HBM seconds at efficiency 1, fixed seconds) per cluster, plus CPU and transfer time."""
    cost = recipe.facts["cost"]
    eff = cost["efficiency"]
    rows = [(c["mme_s"] * eff["mme"], c["tpc_s"] * eff["tpc"], c["hbm_s"] * eff["hbm"], c["launch_s"])
            for c in cost["clusters"]]
    return rows + [(0.0, 0.0, 0.0, cost["cpu_s"] + cost["transfer_s"])]


def seconds(terms, mme: float, tpc: float, hbm: float) -> float:
    return sum(max(m / mme, t / tpc, h / hbm) + fixed for m, t, h, fixed in terms)


def row_terms(prefill, decode, row) -> list[tuple[float, list]]:
    """(weight, terms) pairs whose weighted times sum to the row's total time."""
    kind, inp, out, batch, _ = row
    parts = [(1.0, raw_terms(prefill.at({"batch": batch, "input_len": inp})))]
    if kind == "throughput":
        parts += [(w, raw_terms(decode.at({"batch": batch, "kv_len": kv}))) for kv, w in decode_points(inp, out)]
    return parts


def estimate(row, parts, mme: float, tpc: float, hbm: float) -> float:
    kind, _, out, batch, _ = row
    total = sum(w * seconds(terms, mme, tpc, hbm) for w, terms in parts)
    return batch * out / total if kind == "throughput" else total * 1e3


def fit(rows, parts) -> tuple[float, float, float]:
    """(MME, HBM factor, worst |log ratio|) minimizing the worst row (TPC at the MME factor)."""
    grid = [round(0.20 + 0.01 * i, 2) for i in range(81)]
    best = None
    for mme, hbm in itertools.product(grid, grid):
        worst = max(abs(math.log(estimate(r, p, mme, mme, hbm) / r[4])) for r, p in zip(rows, parts))
        if best is None or worst < best[2]:
            best = (mme, hbm, worst)
    return best


def evaluate(target: str, spec) -> tuple[list, list]:
    start = time.perf_counter()
    prefill, decode = step_graphs(spec, target, "fp8")
    print(f"{target}: lowered prefill and decode in {time.perf_counter() - start:.1f} s")
    parts = [row_terms(prefill, decode, r) for r in ROWS[target]]
    return ROWS[target], parts


def table_rows(target, rows, parts, factors) -> list[dict]:
    out = []
    for r, p in zip(rows, parts):
        est = estimate(r, p, *factors)
        out.append({"target": target, "kind": r[0], "input": r[1], "output": r[2], "batch": r[3],
                    "published": r[4], "estimate": est, "ratio": est / r[4],
                    "unit": "tokens/s" if r[0] == "throughput" else "ms", "fitted_on": target == "gaudi2"})
    return out


def plot(rows: list[dict], name: str) -> str | None:
    labels = [f"{r['target']} {r['kind'][:3]} {r['input']}/{r['output']}/{r['batch']}" for r in rows]
    return ratio_plot(name, rows, labels, "LLaMA 2 7B fp8, 1 card: estimate / Intel's published "
                      "(blue: fitted gaudi2; orange: gaudi3 check)", GOAL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gaudi3", action="store_true", help="Skip the Gaudi 3 check rows.")
    parser.add_argument("--quick", action="store_true", help="Gaudi 2 rows only, into capacity_bench_quick.json.")
    args = parser.parse_args()
    args.no_gaudi3 = args.no_gaudi3 or args.quick
    spec = load_model_file(str(ROOT / "models" / "llama.py") + ":LLAMA2_7B")
    rows, parts = evaluate("gaudi2", spec)
    mme, hbm, worst = fit(rows, parts)
    shipped = (EFFICIENCY.mme, EFFICIENCY.tpc, EFFICIENCY.hbm)
    results = table_rows("gaudi2", rows, parts, shipped)
    fitted = table_rows("gaudi2", rows, parts, (mme, mme, hbm))
    if not args.no_gaudi3:
        rows3, parts3 = evaluate("gaudi3", spec)
        results += table_rows("gaudi3", rows3, parts3, shipped)
    print(f"fitted on gaudi2: mme={mme:.2f} hbm={hbm:.2f} (tpc=mme), worst row x{math.exp(worst):.3f}; "
          f"shipped in targets.py: mme={EFFICIENCY.mme} tpc={EFFICIENCY.tpc} hbm={EFFICIENCY.hbm}")
    print_table("LLaMA 2 7B fp8, 1 card: estimate (targets.py factors) / published",
                ["target", "row (in/out/batch)", "published", "estimate", "ratio"],
                [[r["target"], f"{r['kind']} {r['input']}/{r['output']}/{r['batch']}",
                  f"{r['published']:,} {r['unit']}", f"{r['estimate']:,.2f} {r['unit']}", f"{r['ratio']:.2f}"]
                 for r in results])
    name = "capacity_bench" + ("_quick" if args.quick else "")
    png = plot(results, name)
    path = write_results(name, {
        "sources": [SOURCE_G2, SOURCE_G3], "goal": f"every row within ±{GOAL:.0%}",
        "efficiency": {"mme": EFFICIENCY.mme, "tpc": EFFICIENCY.tpc, "hbm": EFFICIENCY.hbm, "host": EFFICIENCY.host},
        "fitted": {"mme": mme, "tpc": mme, "hbm": hbm, "worst_ratio": math.exp(worst),
                   "rows": fitted},
        "rows": results, "within_goal": all(abs(r["ratio"] - 1) <= GOAL for r in results), "plot": png})
    print(f"wrote {path}" + (f" and {png}" if png else " (matplotlib not installed: no plot)"))


if __name__ == "__main__":
    main()
