"""Run every benchmark in one go and summarize the targets: bench/results/summary.json.

``python bench/run_all.py`` (full, ~15 min on 2 cores) or ``--quick`` (CI smoke run: small sizes,
no inductor; it asserts nothing about time). Each benchmark also writes its own JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time

from common import RESULTS, ROOT, print_table, write_results

SCRIPTS = ["latency_bench", "first_call_bench", "lowering_bench", "dispatch_bench", "cache_bench", "warm_bench",
           "cli_bench", "fleet_bench", "capacity_bench", "fabric_bench",
           "train_bench", "startup_bench"]


def _load(name: str, quick: bool) -> dict:
    for candidate in ([f"{name}_quick", name] if quick else [name]):
        path = RESULTS / f"{candidate}.json"
        if path.exists():
            return json.loads(path.read_text())
    return {}


def summarize(quick: bool) -> list[list]:
    """Rows of (measure, value, target, met) from the benchmarks' JSON files."""
    rows = []
    lat = _load("latency_bench", quick).get("cases", {})
    for case, target in (("mlp8_b8", 0.9), ("gpt_b1_s32", 0.9), ("gpt_b8_s512", 1.05)):
        if case in lat:
            r = lat[case]["ratio_to_eager"]["hpu_backend"]
            rows.append([f"latency {case}: hpu_backend / eager", r, f"≤ {target}", r <= target])
            if "hpu_package" in lat[case]["ratio_to_eager"]:
                p = lat[case]["ratio_to_eager"]["hpu_package"]
                rows.append([f"latency {case}: package / eager", p, f"≤ hpu_backend ({r:.3f})", p <= r])
            if "hpu_graph" in lat[case]["ratio_to_eager"] and case != "gpt_b8_s512":
                g = lat[case]["ratio_to_eager"]["hpu_graph"]
                rows.append([f"latency {case}: HPU graph / eager", g, "≤ 0.75", g <= 0.75])
    first = _load("first_call_bench", quick).get("results", {})
    for combo, by_case in first.items():
        warm_target = 0.75 if combo.endswith("train") else 0.65
        for case, target in (("hpu_backend cold", 1.1), ("hpu_backend warm", warm_target)):
            if case in by_case:
                r = by_case[case]["ratio_to_aot_eager"]
                rows.append([f"first result {combo}, {case} / aot_eager", r, f"≤ {target}", r <= target])
        if "hpu_backend package" in by_case:
            pkg = by_case["hpu_backend package"]
            r = pkg["ratio_to_aot_eager"]
            rows.append([f"first result {combo}, package / aot_eager", r, "≤ 0.15", r <= 0.15])
            if "ratio_to_inductor_warm" in pkg:
                r = pkg["ratio_to_inductor_warm"]
                rows.append([f"first result {combo}, package / inductor warm", r, "≤ 0.1", r <= 0.1])
    low = _load("lowering_bench", quick).get("rows", [])
    if low:
        worst = max(r["lowering_pct_of_trace"] for r in low)
        rows.append(["lowering % of AOTAutograd trace (worst depth)", worst, "≤ 10", worst <= 10])
    disp = _load("dispatch_bench", quick)
    if disp:
        sel = disp["bucket_selection"]["selection_us"]
        rows.append(["bucket selection µs per call", sel, "< 2", sel < 2])
        ratio = disp["load_vs_build"]["ratio"]
        rows.append(["recipe load / build", ratio, "≤ 0.1", ratio <= 0.1])
    fleet = _load("fleet_bench", quick).get("ratio_to_compile", {})
    for step, r in fleet.items():
        if "compile" not in step:
            rows.append([f"fleet tier, gpt: {step} / compile", r, "—", True])
    cap = _load("capacity_bench", quick).get("rows", [])
    if cap:
        worst = max(abs(r["ratio"] - 1) for r in cap)
        rows.append(["capacity: LLaMA 2 7B fp8 estimate / Intel's published, worst |ratio - 1|", worst, "≤ 0.35",
                     worst <= 0.35])
    fab = [r for r in _load("fabric_bench", quick).get("rows", []) if r["fitted_on"]]
    if fab:
        worst = max(abs(math.log(r["ratio"])) for r in fab)
        rows.append(["multi-card: LLaMA 2 70B fp8 estimate / Intel's published (calibration rows), worst ratio",
                     f"×{math.exp(worst):.2f}", "within ±25%", all(abs(r["ratio"] - 1) <= 0.25 for r in fab)])
    train = [r for r in _load("train_bench", quick).get("rows", []) if r["role"] == "calibration"]
    for r in train:
        rows.append(["training: LLaMA 2 7B 8 cards fp8 estimate / Intel's published (calibration row)",
                     f"{r['ratio']:.2f}", "within ±25%", abs(r["ratio"] - 1) <= 0.25])
    cli = _load("cli_bench", quick)
    for command, r in cli.get("results", {}).items():
        if "reference" not in command:
            ok = r["wall_s"] <= 0.3 and r["rss_mb"] <= 60
            rows.append([f"hpurecipe {command}, {cli['entries']} entries: s / MB", f"{r['wall_s']:.3f} / "
                         f"{r['rss_mb']:.0f}", "≤ 0.3 / 60", ok])
    start = _load("startup_bench", quick)
    for command, s in start.get("beyond_import_torch_s", {}).items():
        rows.append([f"start-up of {command}: s beyond import torch", f"{s:.3f}", "≤ 0.5", s <= 0.5])
    for command, s in start.get("cpu_beyond_import_torch_s", {}).items():  # less moved by a loaded machine
        rows.append([f"start-up of {command}: CPU s beyond import torch", f"{s:.3f}", "≤ 0.5", s <= 0.5])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=SCRIPTS, help="run just these")
    ap.add_argument("--summarize", action="store_true", help="only summarize the JSON results already written "
                    "(into summary.json)")
    args = ap.parse_args()
    timings = {}
    for name in [] if args.summarize else args.only or SCRIPTS:
        if name == "fleet_bench" and shutil.which("redis-server") is None:
            print("fleet_bench skipped: no redis-server (apt-get install redis-server)")
            continue
        start = time.time()
        cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *(["--quick"] if args.quick else [])]
        subprocess.run(cmd, check=True, cwd=ROOT)
        timings[name] = time.time() - start
    rows = summarize(args.quick)
    print_table("targets (estimates of this machine, ratios from the same run)", ["measure", "value", "target",
                "met"], rows)
    write_results("summary" + ("_quick" if args.quick else ""),
                  {"seconds": timings, "targets": [dict(zip(["measure", "value", "target", "met"], r))
                                                   for r in rows]})


if __name__ == "__main__":
    main()
