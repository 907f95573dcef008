"""FusedSDPA's recompute_mode in the planned recipes: peak HBM, saved probabilities, FLOPs and estimated time.

One causal training step through ``hpu_backend.gaudi.FusedSDPA`` per recompute choice, compiled
with ``backend="hpu_backend"``; reads the forward and backward recipes' memory plan and cost
estimate (estimates for the target device, not measurements; no wall-clock time is involved).

    python bench/sdpa_recompute_bench.py [--batch 1] [--heads 8] [--seq 512] [--dim 128] [--target gaudi2]

Writes bench/results/sdpa_recompute_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch._dynamo

from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.gaudi import FusedSDPA

RESULTS = Path(__file__).resolve().parent / "results" / "sdpa_recompute_bench.json"
MIB = 2 ** 20


def plan(recompute: bool, shape: tuple[int, int, int, int], target: str) -> list[dict]:
    """One row per recipe (forward, backward) of a causal FusedSDPA training step."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fn = torch.compile(lambda q, k, v: FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", recompute),
                       backend="hpu_backend", options={"cache": False, "target": target})
    with collect_recipes() as found:
        fn(q, k, v).sum().backward()
    rows = []
    for _, recipe, _ in sorted(found, key=lambda f: f[1].kind != "forward"):
        memory, cost = recipe.facts["memory"], recipe.facts["cost"]
        rows.append({"recompute": recompute, "kind": recipe.kind, "peak_bytes": memory["peak_bytes"],
                     "saved_probs_bytes": memory["saved_probs_bytes"],
                     "flops": sum(c["flops"] for c in cost["clusters"]),
                     "est_device_s": cost["device_s"], "bound": [c["bound"] for c in cost["clusters"]]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 1), ("heads", 8), ("seq", 512), ("dim", 128)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--target", default="gaudi2", choices=["gaudi2", "gaudi3"])
    args = parser.parse_args()
    shape = (args.batch, args.heads, args.seq, args.dim)
    rows = plan(False, shape, args.target) + plan(True, shape, args.target)
    print(f"{'recompute':>9} {'recipe':>8} {'peak HBM':>10} {'saved P':>9} {'GFLOP':>7} {'est. time':>10}  bound")
    for r in rows:
        print(f"{r['recompute']!s:>9} {r['kind']:>8} {r['peak_bytes'] / MIB:8.1f}Mi "
              f"{r['saved_probs_bytes'] / MIB:7.1f}Mi {r['flops'] / 1e9:7.2f} {r['est_device_s'] * 1e6:8.1f}us  "
              f"{','.join(r['bound'])}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"shape_bhsd": shape, "dtype": "bfloat16", "target": args.target,
                                   "estimate": True, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
