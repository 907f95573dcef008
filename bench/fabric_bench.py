"""Calibrate and check the scale-up fabric model against Intel's published multi-card LLaMA numbers.

Each (model, target, cards) is planned per card as ``hpurecipe analyze --cards`` does it
(``hpu_backend.planning.capacity.card_steps``: one card's tensor-parallel shard lowered with one and two layers,
extrapolated over the model's layers). Every estimated step is a sum over clusters of
compute (max of MME, TPC, HBM time) + exposed collective time + launch, where a collective costs its wire
time (at the fabric efficiency) plus its latency steps, and ``overlap`` of the exposed wire time hides behind
the cluster's compute. From each cluster's raw terms the estimate is recomputed at any fabric factors without
lowering again (checked against the planner at the shipped factors).

The fit: the fabric efficiency, per-step latency and overlap minimizing the largest |log(estimate/published)|
over ONLY the four Gaudi 2 LLaMA 2 70B throughput rows and the two 8-card first-token latency rows (Intel,
Model Performance Data for Gaudi 2, software 1.18.0, fp8). Every other row is validation. The single-card
device efficiencies (targets.EFFICIENCY) are not refitted.

    python bench/fabric_bench.py [--quick] [--plot-only]

Writes bench/results/fabric_bench.json and, with matplotlib, bench/results/fabric_bench.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

from common import RESULTS, ROOT, print_table, ratio_plot, write_results

from hpu_backend.diagnosis.analyze import hbm_bytes
from hpu_backend.planning.capacity import LayeredStep, card_steps, decode_points
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.targets import EFFICIENCY, fabric

G2 = "Intel, Model Performance Data for Intel Gaudi 2 AI Accelerators (software 1.18.0), fp8"
G3 = "Intel, Model Performance Data for Intel Gaudi 3 AI Accelerators (software 1.18.0), fp8"
# (model file attr, target, cards, kind, input, output, batch, published, fitted): tokens/s for "throughput",
# ms for "latency" (batch 1: the prefill step, the first token).
ROWS = [
    ("LLAMA2_70B", "gaudi2", 2, "throughput", 128, 128, 1750, 2844, True),
    ("LLAMA2_70B", "gaudi2", 4, "throughput", 128, 2048, 327, 3211, True),
    ("LLAMA2_70B", "gaudi2", 2, "throughput", 2048, 128, 95, 310, True),
    ("LLAMA2_70B", "gaudi2", 2, "throughput", 2048, 2048, 78, 1438, True),
    ("LLAMA2_70B", "gaudi2", 8, "latency", 128, 1, 1, 26.93, True),
    ("LLAMA2_70B", "gaudi2", 8, "latency", 2048, 1, 1, 116, True),
    # validation: never fitted on
    ("LLAMA31_8B", "gaudi2", 1, "throughput", 128, 128, 2429, 18201, False),
    ("LLAMA31_8B", "gaudi2", 1, "throughput", 128, 2048, 289, 11138, False),
    ("LLAMA31_8B", "gaudi2", 1, "throughput", 2048, 128, 179, 2028, False),
    ("LLAMA31_8B", "gaudi2", 1, "throughput", 2048, 2048, 155, 5511, False),
    ("LLAMA31_8B", "gaudi2", 1, "latency", 128, 1, 1, 8.17, False),
    ("LLAMA31_8B", "gaudi2", 1, "latency", 2048, 1, 1, 60.52, False),
    ("LLAMA2_70B", "gaudi3", 2, "throughput", 128, 128, 1750, 4433, False),
    ("LLAMA2_70B", "gaudi3", 2, "throughput", 128, 2048, 512, 6026, False),
    ("LLAMA2_70B", "gaudi3", 2, "throughput", 2048, 128, 231, 498, False),
    ("LLAMA2_70B", "gaudi3", 2, "throughput", 2048, 2048, 240, 2641, False),
    ("LLAMA31_70B", "gaudi3", 2, "throughput", 128, 128, 3516, 3711, False),
    ("LLAMA31_70B", "gaudi3", 2, "throughput", 128, 2048, 450, 5776, False),
    ("LLAMA31_70B", "gaudi3", 2, "throughput", 2048, 128, 223, 497, False),
    ("LLAMA31_70B", "gaudi3", 2, "throughput", 2048, 2048, 175, 2588, False),
    ("LLAMA31_70B", "gaudi3", 8, "throughput", 128, 128, 4000, 15008, False),
    ("LLAMA31_70B", "gaudi3", 8, "throughput", 128, 2048, 600, 15711, False),
    ("LLAMA31_70B", "gaudi3", 8, "throughput", 2048, 128, 400, 1600, False),
    ("LLAMA31_70B", "gaudi3", 8, "throughput", 2048, 2048, 600, 8946, False),
    ("LLAMA31_8B", "gaudi3", 1, "throughput", 128, 128, 1536, 24310, False),
    ("LLAMA31_8B", "gaudi3", 1, "throughput", 128, 2048, 768, 18830, False),
    ("LLAMA31_8B", "gaudi3", 1, "throughput", 2048, 128, 256, 2652, False),
    ("LLAMA31_8B", "gaudi3", 1, "throughput", 2048, 2048, 364, 7405, False),
]
GOAL = 0.25  # every calibration row within ±25%


def raw_terms(recipe) -> list[tuple]:
    """Per cluster: (MME, TPC, HBM s at efficiency 1, launch, wire s at fabric efficiency 1, latency steps)."""
    cost = recipe.facts["cost"]
    eff, net = cost["efficiency"], fabric(recipe.target)
    rows = []
    for c in cost["clusters"]:
        latency = c.get("net_latency_s", 0.0)
        wire = (c.get("net_s", 0.0) - latency) * net.efficiency
        rows.append((c["mme_s"] * eff["mme"], c["tpc_s"] * eff["tpc"], c["hbm_s"] * eff["hbm"], c["launch_s"],
                     wire, latency / net.latency_s))
    return rows + [(0.0, 0.0, 0.0, cost["cpu_s"] + cost["transfer_s"], 0.0, 0.0)]


def seconds(terms, e: float, lat: float, o: float) -> float:
    total = 0.0
    for m, t, h, fixed, wire, steps in terms:
        compute = max(m / EFFICIENCY.mme, t / EFFICIENCY.tpc, h / EFFICIENCY.hbm)
        latency = steps * lat
        comm = wire / e + latency
        total += compute + comm - o * min(comm - latency, compute) + fixed
    return total


def step_terms(step, point) -> tuple:
    """(terms of one layer, terms of two, layers), or (terms, None, 1) for a step lowered whole."""
    if isinstance(step, LayeredStep):
        return raw_terms(step.one.at(point)), raw_terms(step.two.at(point)), step.layers
    return raw_terms(step.at(point)), None, 1


def step_seconds(parts, e, lat, o) -> float:
    one, two, layers = parts
    a = seconds(one, e, lat, o)
    return a if two is None else a + (layers - 1) * (seconds(two, e, lat, o) - a)


def row_parts(steps, row) -> list:
    _, _, _, kind, inp, out, batch, _, _ = row
    prefill, decode = steps
    parts = [(1.0, step_terms(prefill, {"batch": batch, "input_len": inp}))]
    if kind == "throughput":
        parts += [(w, step_terms(decode, {"batch": batch, "kv_len": kv})) for kv, w in decode_points(inp, out)]
    return parts


def estimate(row, parts, e, lat, o) -> float:
    kind, out, batch = row[3], row[5], row[6]
    total = sum(w * step_seconds(p, e, lat, o) for w, p in parts)
    return batch * out / total if kind == "throughput" else total * 1e3


def fits(steps, row) -> bool:
    """Whether the published batch fits the planned per-card HBM (prefill, and decode at the last KV length)."""
    prefill, decode = steps
    hbm = hbm_bytes(row[1])
    return (prefill.peak_bytes({"batch": row[6], "input_len": row[4]}) <= hbm
            and (row[3] == "latency" or decode.peak_bytes({"batch": row[6], "kv_len": row[4] + row[5] - 1}) <= hbm))


def fit(rows, parts) -> tuple[float, float, float, float]:
    """(efficiency, latency s, overlap, worst |log ratio|) over the calibration rows."""
    best = None
    effs = [round(0.30 + 0.05 * i, 2) for i in range(15)]
    lats = [round(2e-6 * i, 6) for i in range(1, 51)]
    overlaps = [round(0.1 * i, 1) for i in range(11)]
    for e, lat, o in itertools.product(effs, lats, overlaps):
        worst = max(abs(math.log(estimate(r, p, e, lat, o) / r[7])) for r, p in zip(rows, parts))
        if best is None or worst < best[3]:
            best = (e, lat, o, worst)
    return best


def plot(results: list[dict]) -> str | None:
    labels = [f"{r['model']} {r['target']} x{r['cards']} {r['kind'][:3]} {r['input']}/{r['output']}/{r['batch']}"
              for r in results]
    return ratio_plot("fabric_bench", results, labels, "Multi-card fp8 inference: estimate / Intel's published "
                      "(blue: fitted; orange: validation)", GOAL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Calibration rows only (no validation rows).")
    parser.add_argument("--plot-only", action="store_true", help="Plot bench/results/fabric_bench.json again.")
    args = parser.parse_args()
    if args.plot_only:
        path = RESULTS / "fabric_bench.json"
        doc = json.loads(path.read_text())
        doc["plot"] = plot(doc["rows"])
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {doc['plot']}")
        return
    rows = [r for r in ROWS if r[8] or not args.quick]
    steps, parts, timings = {}, [], {}
    for r in rows:
        key = (r[0], r[1], r[2])
        if key not in steps:
            start = time.perf_counter()
            spec = load_model_file(f"{ROOT / 'models' / 'llama.py'}:{r[0]}")
            steps[key] = card_steps(spec, r[1], "fp8", r[2])
            timings["/".join(map(str, key))] = time.perf_counter() - start
            print(f"{'/'.join(map(str, key))}: lowered in {timings['/'.join(map(str, key))]:.1f} s")
        parts.append(row_parts(steps[key], r))
    calib = [(r, p) for r, p in zip(rows, parts) if r[8]]
    e, lat, o, worst = fit([r for r, _ in calib], [p for _, p in calib])
    net = fabric("gaudi2")
    shipped = (net.efficiency, net.latency_s, net.overlap)
    results = []
    for r, p in zip(rows, parts):
        est = estimate(r, p, *shipped)
        results.append({"model": r[0], "target": r[1], "cards": r[2], "kind": r[3], "input": r[4], "output": r[5],
                        "batch": r[6], "published": r[7], "estimate": est, "ratio": est / r[7],
                        "fitted_on": r[8], "batch_fits": fits(steps[(r[0], r[1], r[2])], r),
                        "at_fitted": estimate(r, p, e, lat, o) / r[7],
                        "comm_share_no_overlap": 1 - estimate(r, p, 1e9, 0.0, 0.0) / est if r[3] == "latency"
                        else 1 - est / estimate(r, p, 1e9, 0.0, 0.0),
                        "unit": "tokens/s" if r[3] == "throughput" else "ms"})
    print(f"fitted: efficiency={e:.2f} latency={lat * 1e6:.0f} us overlap={o:.2f}, worst calibration row "
          f"x{math.exp(worst):.3f}; shipped in targets.py: efficiency={shipped[0]} latency={shipped[1] * 1e6:.0f} us "
          f"overlap={shipped[2]}")
    print_table("Multi-card fp8: estimate (targets.py factors) / published",
                ["row", "published", "estimate", "ratio", "at fit", "comm", "batch fits", "fitted on"],
                [[f"{r['model']} {r['target']} x{r['cards']} {r['kind']} {r['input']}/{r['output']}/{r['batch']}",
                  f"{r['published']:,} {r['unit']}", f"{r['estimate']:,.1f}", f"{r['ratio']:.2f}",
                  f"{r['at_fitted']:.2f}", f"{r['comm_share_no_overlap']:.0%}",
                  "yes" if r["batch_fits"] else "NO", "yes" if r["fitted_on"] else "-"] for r in results])
    png = None if args.quick else plot(results)
    name = "fabric_bench" + ("_quick" if args.quick else "")
    path = write_results(name, {
        "sources": [G2, G3], "goal": f"every calibration row within ±{GOAL:.0%}",
        "fabric": {"efficiency": shipped[0], "latency_s": shipped[1], "overlap": shipped[2]},
        "fitted": {"efficiency": e, "latency_s": lat, "overlap": o, "worst_ratio": math.exp(worst)},
        "lowering_s": timings, "rows": results,
        "calibration_within_goal": all(abs(r["ratio"] - 1) <= GOAL for r in results if r["fitted_on"]),
        "plot": png})
    print(f"wrote {path}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()
