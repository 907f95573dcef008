"""Time to first result in a fresh process, from torch.compile to the first output.

Cases: hpu_backend with a cold and a warm recipe cache, aot_eager, inductor cold and warm (its
FX graph cache). Each run is a new interpreter; hpu_backend runs report the phase breakdown
(capture, key, executor build, cache load, lowering) and the rest is Dynamo + AOTAutograd + first
execution. Targets: cold ≤ 1.3× aot_eager; warm ≤ 1.0× aot_eager. Writes
bench/results/first_call_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, maybe_plot, print_table, write_results

CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import torch
sys.path.insert(0, sys.argv[3])
from common import load_model_file
gpt = load_model_file("gpt")
model = gpt.make_model().eval()
tokens = gpt.make_inputs(1, 32)[0]
backend = sys.argv[1]
start = time.perf_counter()
compiled = torch.compile(model, backend=backend)
with torch.no_grad():
    compiled(tokens)
    first = time.perf_counter() - start
    t0 = time.perf_counter(); compiled(tokens); steady = time.perf_counter() - t0
phases = {}
if backend == "hpu_backend":
    from hpu_backend.metrics import phase_times
    phases = phase_times()
print(json.dumps({"first_s": first, "steady_s": steady, "phases": phases}))
"""


def run(backend: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, backend, "", str(ROOT / "bench")], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one repetition, no inductor")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per case (median taken)")
    args = ap.parse_args()
    repeat = 1 if args.quick else args.repeat
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = dict(os.environ, PT_HPU_RECIPE_CACHE_CONFIG=f"{tmp}/recipes,false,1024",
                    TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor")
        cases = [("hpu_backend cold", "hpu_backend", True), ("hpu_backend warm", "hpu_backend", False),
                 ("aot_eager", "aot_eager", False)]
        if not args.quick:
            cases += [("inductor cold", "inductor", True), ("inductor warm", "inductor", False)]
        for label, backend, cold in cases:
            runs = []
            for _ in range(repeat):
                if cold:
                    subprocess.run(["rm", "-rf", f"{tmp}/recipes", f"{tmp}/inductor"], check=True)
                runs.append(run(backend, base))
            runs.sort(key=lambda r: r["first_s"])
            results[label] = runs[len(runs) // 2]
    ref = results["aot_eager"]["first_s"]
    rows = [[k, v["first_s"], v["first_s"] / ref, *(v["phases"].get(p, 0.0) * 1e3 for p in PHASES)]
            for k, v in results.items()]
    print_table("time to first result (s), models/gpt.py b1 s32, fresh process",
                ["case", "first (s)", "/aot_eager", *[f"{p} ms" for p in PHASES]], rows)
    for v in results.values():
        v["ratio_to_aot_eager"] = v["first_s"] / ref
    path = write_results("first_call_bench" + ("_quick" if args.quick else ""), {"cases": results})
    maybe_plot("first_call_bench", list(results), {"first call (s)": [v["first_s"] for v in results.values()]},
               "seconds")
    print(f"wrote {path}")


PHASES = ("capture", "key", "executor", "cache_get", "lowering")

if __name__ == "__main__":
    main()
