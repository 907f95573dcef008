"""Warm-up throughput: buckets per second for `hpurecipe warm` and `hpurecipe prebuild -j 2` on models/gpt.py.

Each run is a fresh `hpurecipe` process on an empty cache (cold), as a deployment step would be;
`warm` is also run again on its filled cache (hot: every recipe from disk). The wall time includes
process start-up (importing torch); the command's own time does not. An eager pass over the same
buckets (in this process) is the baseline. Writes bench/results/warm_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "gpt.py"


def run(args: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hpurecipe.main", *args, "--json"], capture_output=True,
                          text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"hpurecipe {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout)
    return {"buckets": doc["buckets"], "compiled": doc["compiled"], "hits": doc["hits"],
            "seconds": doc["seconds"], "wall_seconds": round(wall, 3),
            "buckets_per_s": round(doc["buckets"] / doc["seconds"], 3),
            "buckets_per_s_wall": round(doc["buckets"] / wall, 3)}


def eager(axes: list[str]) -> dict:
    from hpu_backend.modelfiles.modelfile import load_model_file

    spec = load_model_file(MODEL)
    overrides = {a.split("=")[0]: [int(v) for v in a.split("=")[1].split(",")] for a in axes}
    spec = spec.with_axes(overrides) if overrides else spec
    model = spec.make_model().eval()
    start = time.perf_counter()
    with torch.no_grad():
        for point in spec.points():
            model(*spec.split(spec.make_inputs(**point)))
    seconds = time.perf_counter() - start
    return {"buckets": len(spec.points()), "seconds": round(seconds, 4),
            "buckets_per_s": round(len(spec.points()) / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only seq 16 and 32 (4 buckets instead of 8)")
    parser.add_argument("--jobs", type=int, default=2, help="prebuild worker processes")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.out is None:  # a quick (smoke) run never overwrites the full results
        full = ROOT / "bench" / "results" / "warm_bench.json"
        args.out = full.with_name(full.stem + "_quick.json") if args.quick else full
    axes = ["seq=16,32"] if args.quick else []
    axis_args = [x for a in axes for x in ("--axis", a)]
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "warm (cold)": run(["warm", str(MODEL), "--cache-dir", f"{tmp}/warm", *axis_args]),
            "warm (hot)": run(["warm", str(MODEL), "--cache-dir", f"{tmp}/warm", *axis_args]),
            f"prebuild -j {args.jobs} (cold)": run(["prebuild", str(MODEL), "-j", str(args.jobs), "--cache-dir",
                                                    f"{tmp}/prebuild", *axis_args]),
        }
    doc = {"model": "models/gpt.py", "quick": args.quick, "axes": axes, "torch": torch.__version__,
           "cpus": __import__("os").cpu_count(), "eager": eager(axes), "runs": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'run':<22}{'buckets':>8}{'compiled':>9}{'hits':>6}{'cmd s':>8}{'wall s':>8}{'bkt/s':>8}{'bkt/s wall':>11}")
    for name, r in results.items():
        print(f"{name:<22}{r['buckets']:>8}{r['compiled']:>9}{r['hits']:>6}{r['seconds']:>8.2f}{r['wall_seconds']:>8.2f}"
              f"{r['buckets_per_s']:>8.2f}{r['buckets_per_s_wall']:>11.2f}")
    e = doc["eager"]
    print(f"{'eager forward':<22}{e['buckets']:>8}{'':>9}{'':>6}{e['seconds']:>8.3f}{'':>8}{e['buckets_per_s']:>8.1f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
