"""The hpu device against the CPU: one training step of the docs' MNIST model (models/mnist.py) at batch 64.

The same Gaudi-style loop (model and batch moved to the device, zero_grad, forward, nll_loss, backward,
mark_step, SGD step, mark_step) runs in three fresh processes: on the CPU, on the hpu device in eager mode
(PT_HPU_LAZY_MODE=0) and in lazy mode (graphs cached after the first step). Each reports the median wall time
per step over the measured steps (after warm-up steps), and its losses, which must match the CPU's. The three
run interleaved ``--repeats`` times; a mode's time is the median over its runs.

    OMP_NUM_THREADS=1 python bench/device_bench.py [--steps 10] [--warmup 3] [--repeats 3]

Writes bench/results/device_bench.json and prints one line per mode with its ratio to the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from common import maybe_plot, run_worker

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "device_bench.json"
MODES = ("cpu", "eager", "lazy")


def worker(mode: str, steps: int, warmup: int) -> dict:
    """One process: train ``warmup + steps`` steps in ``mode``; the per-step times and losses."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_model_file

    device = "cpu"
    if mode != "cpu":
        import hpu_backend.device as hd
        from hpu_backend import gaudi
        hd.enable(mode)
        device = "hpu"
    mark_step = gaudi.mark_step if mode != "cpu" else (lambda: None)
    mnist = load_model_file("mnist")
    torch.manual_seed(0)
    model = mnist.make_model().eval().to(device)  # eval: no dropout, so every mode draws the same numbers
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [tuple(t.to(device) for t in mnist.make_inputs(64, seed=s)) for s in range(4)]
    times, losses = [], []
    for step in range(warmup + steps):
        images, labels = batches[step % len(batches)]
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        mark_step()
        opt.step()
        mark_step()
        losses.append(loss.detach())
        if mode == "lazy":
            loss.item()  # the step's graphs have run (a CPU step is done when it returns)
        times.append(time.perf_counter() - start)
    return {"mode": mode, "step_s": statistics.median(times[warmup:]), "first_step_s": times[0],
            "losses": [float(v) for v in losses]}


def run(mode: str, steps: int, warmup: int) -> dict:
    return run_worker(__file__, mode, steps, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=MODES)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup)))
        return
    runs = {mode: [] for mode in MODES}
    for _ in range(args.repeats):  # interleaved, so that a change in the machine's load hits every mode alike
        for mode in MODES:
            runs[mode].append(run(mode, args.steps, args.warmup))
    rows = {mode: dict(found[0], step_s=statistics.median(r["step_s"] for r in found),
                       step_s_per_repeat=[r["step_s"] for r in found]) for mode, found in runs.items()}
    cpu = rows["cpu"]
    for mode in ("eager", "lazy"):
        row = rows[mode]
        row["ratio_to_cpu"] = row["step_s"] / cpu["step_s"]
        row["losses_match_cpu"] = all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(row["losses"],
                                                                                            cpu["losses"]))
    result = {"model": "models/mnist.py", "batch": 64, "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats, "load_average_1min": os.getloadavg()[0],
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "rows": list(rows.values())}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    maybe_plot("device_bench", [f"{m} ({rows[m]['step_s'] / cpu['step_s']:.2f}x)" for m in MODES],
               {"median ms per training step": [rows[m]["step_s"] * 1e3 for m in MODES]}, "ms per step (batch 64)")
    for row in rows.values():
        extra = "" if row["mode"] == "cpu" else \
            f", {row['ratio_to_cpu']:.2f}x the CPU, losses match: {row['losses_match_cpu']}"
        print(f"{row['mode']}: {row['step_s'] * 1e3:.1f} ms per step (first step {row['first_step_s']:.2f} s){extra}")


if __name__ == "__main__":
    main()
