"""Steady-state per-call latency: eager vs aot_eager vs inductor vs hpu_backend vs a recipe package vs HPU
Graphs, in one run.

Host-bound: 8× Linear(64,64)+GELU at batch 8, and models/gpt.py at batch 1, seq 32 (inference).
Compute-bound: models/gpt.py at batch 8, seq 512. "hpu_package" serves the same shape from a package
(``build_package`` then ``load_package``); "hpu_graph" is ``wrap_in_hpu_graph(model)``; "hpu_reduce_overhead"
is ``torch.compile(model, backend="hpu_backend", mode="reduce-overhead")``.
Writes bench/results/latency_bench.json.
Targets (ratios to eager): hpu_backend ≤ 0.9 host-bound, ≤ 1.05 compute-bound; hpu_package ≤ hpu_backend;
hpu_graph ≤ 0.75 host-bound.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from common import BACKENDS, load_model_file, maybe_plot, per_call_us, print_table, write_results
from hpu_backend import load_package
from hpu_backend.shipping.package import build_package
from hpu_backend.gaudi import wrap_in_hpu_graph
from hpu_backend.modelfiles.modelspec import spec_from


def mlp_case():
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(64, 64), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(8, 64),)


def gpt_case(batch: int, seq: int):
    gpt = load_model_file("gpt")
    model = gpt.make_model().eval()
    return model, gpt.make_inputs(batch, seq)[:1]


CASES = {
    "mlp8_b8": (mlp_case, "host"),
    "gpt_b1_s32": (lambda: gpt_case(1, 32), "host"),
    "gpt_b8_s512": (lambda: gpt_case(8, 512), "compute"),
}


ROUNDS = 7


def prepare(case: str, backend: str):
    """A ready callable (compiled and warmed up) for one case and backend."""
    model, inputs = CASES[case][0]()
    if backend == "hpu_package":
        fn = packaged(model, inputs)
    elif backend == "hpu_graph":
        fn = wrap_in_hpu_graph(model)
    elif backend == "hpu_reduce_overhead":
        fn = torch.compile(model, backend="hpu_backend", mode="reduce-overhead")
    else:
        fn = model if backend == "eager" else torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)  # compile and warm up
    return lambda: fn(*inputs)


def measure_case(case: str, backends: list[str], repeat: int) -> dict[str, float]:
    """µs per call for each backend: the best of ROUNDS rounds, the backends taking turns within each
    round, so that a machine that slows down or speeds up meanwhile affects every backend alike."""
    calls = {b: prepare(case, b) for b in backends}
    best = dict.fromkeys(backends, float("inf"))
    with torch.no_grad():
        for _ in range(ROUNDS):
            for b, call in calls.items():
                best[b] = min(best[b], per_call_us(call, repeat, rounds=1))
    return best


def packaged(model, inputs):
    """A package of ``model`` at the shape of ``inputs`` (static, like torch.compile's first graph), loaded."""
    spec = spec_from({"make_model": lambda: model, "make_inputs": lambda one, seed=0: inputs,
                      "AXES": {"one": [1]}, "COMPILE": {"dynamic": None, "options": {}}}, "latency case")
    with tempfile.TemporaryDirectory() as tmp:
        return load_package(build_package(spec, f"{tmp}/case.hpkg", check=False).path, model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="few repetitions, no inductor (CI smoke run)")
    args = ap.parse_args()
    backends = [b for b in (*BACKENDS, "hpu_package", "hpu_graph",
                            "hpu_reduce_overhead") if not (args.quick and b == "inductor")]
    results, rows = {}, []
    for case, (_, kind) in CASES.items():
        repeat = 5 if args.quick else (10 if kind == "compute" else 1000)
        us = measure_case(case, backends, repeat)
        results[case] = {"kind": kind, "us_per_call": us, "ratio_to_eager": {b: us[b] / us["eager"] for b in us}}
        rows.append([case, kind, *[us[b] for b in backends], *[us[b] / us["eager"] for b in backends[1:]]])
    print_table("per-call latency (µs) and ratio to eager", ["case", "kind", *backends,
                *[f"{b}/eager" for b in backends[1:]]], rows)
    path = write_results("latency_bench" + ("_quick" if args.quick else ""), {"cases": results})
    plot({"cases": results})
    print(f"wrote {path}")


def plot(doc: dict) -> None:
    """bench/results/latency_bench.png from the cases (as written to the JSON)."""
    results = doc["cases"]
    backends = list(dict.fromkeys(b for c in results.values() for b in c["ratio_to_eager"]))
    maybe_plot("latency_bench", list(results), {b: [results[c]["ratio_to_eager"].get(b, 0.0) for c in results]
                                               for b in backends}, "time / eager")


if __name__ == "__main__":
    main()
