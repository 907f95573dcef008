"""Lazy mode against eager: the docs' training loop (models/lazy_training.py) on models/mnist.py and models/gpt.py.

Per model: wall time of N eager iterations, of N lazy iterations with a cold process (recipes compiled or read
from the cache), and of N more lazy iterations in the same process (every graph seen before); recipes compiled
per step, ops per graph; and whether the losses equal eager's (``torch.testing.assert_close``).

    OMP_NUM_THREADS=1 python bench/lazy_bench.py [--steps 20]

Writes bench/results/lazy_bench.json and prints one line per model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from hpu_backend import gaudi

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "lazy_bench.json"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "models" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def lazily(fn):
    before = len(gaudi.lazy_report())
    with gaudi.lazy():
        out = fn()
    return out, gaudi.lazy_report()[before:]


def measure(training, name: str, steps: int) -> dict:
    model_file = load(name)
    run = training.mnist_run if name == "mnist" else training.gpt_run
    (eager, _), eager_s = timed(lambda: run(model_file, steps))
    ((lazy, _), report), cold_s = timed(lambda: lazily(lambda: run(model_file, steps)))
    (_, again), warm_s = timed(lambda: lazily(lambda: run(model_file, steps)))
    torch.testing.assert_close(lazy, eager)
    return {"model": name, "iterations": steps, "eager_s": eager_s, "lazy_cold_s": cold_s, "lazy_warm_s": warm_s,
            "compiled_per_step": [s.compiled for s in report], "compiled_again": sum(s.compiled for s in again),
            "ops_per_graph": sorted({g.ops for s in report for g in s.graphs}), "matches_eager": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    training = load("lazy_training")
    rows = [measure(training, name, args.steps) for name in ("mnist", "gpt")]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    for r in rows:
        print(f"{r['model']}: eager {r['eager_s']:.2f} s, lazy {r['lazy_cold_s']:.2f} s cold / "
              f"{r['lazy_warm_s']:.2f} s warm for {r['iterations']} iterations; "
              f"compiled per step {r['compiled_per_step']}; "
              f"ops per graph {r['ops_per_graph']}")


if __name__ == "__main__":
    main()
