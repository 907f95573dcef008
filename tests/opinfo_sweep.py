"""PyTorch's OpInfo samples through torch.compile: hpu_backend against eager, aot_eager as referee.

Run as a script for the full report: ``python tests/opinfo_sweep.py [--samples N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
import torch._dynamo
from torch.testing._internal.common_methods_invocations import op_db

SAMPLES = 2  # the first few samples per op


def _call(op, sample):
    return op.op(sample.input, *sample.args, **sample.kwargs)


def _same(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b, equal_nan=True)
        return True
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return False


def _run(backend, op, samples) -> str:
    """'pass', or a one-line reason."""
    torch._dynamo.reset()
    fn = torch.compile(lambda s: _call(op, s), backend=backend, fullgraph=False)
    for s in samples:
        try:
            with torch.no_grad():
                expected = _call(op, s)
                got = fn(s)
        except Exception as e:  # noqa: BLE001 - the sweep reports every failure kind
            return f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if not _same(got, expected):
            return "mismatch"
    return "pass"


def _deterministic(op, samples) -> bool:
    """Eager runs and gives the same answer twice (random ops and ops this build lacks are out)."""
    try:
        with torch.no_grad():
            return all(_same(_call(op, s), _call(op, s)) for s in samples)
    except Exception:  # noqa: BLE001 - an op that cannot run eagerly here is not swept
        return False


def sweep(ops=None, samples: int = SAMPLES):
    """{op name: (hpu result, aot_eager result or None if hpu passed)} over float32 CPU samples."""
    results = {}
    for op in ops if ops is not None else op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            chosen = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples]
        except Exception:  # noqa: BLE001 - some OpInfos cannot make samples on this build
            continue
        if not chosen or not _deterministic(op, chosen):
            continue
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = _run("hpu_backend", op, chosen)
            referee = None if ours == "pass" else _run("aot_eager", op, chosen)
        results[name] = (ours, referee)
    torch._dynamo.reset()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    start = time.time()
    res = sweep(samples=args.samples)
    passed = sum(r[0] == "pass" for r in res.values())
    eligible = sum(r[0] == "pass" or r[1] == "pass" for r in res.values())
    print(f"{len(res)} ops swept in {time.time() - start:.0f}s; hpu_backend passes {passed}; "
          f"aot_eager-passing ops: {eligible}; hpu_backend passes {passed}/{eligible} of them")
    for name, (ours, ref) in sorted(res.items()):
        if ours != "pass" and ref == "pass":
            print(f"  {name}: {ours}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
