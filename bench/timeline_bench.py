"""What tracing costs: the 20-step MNIST example run with and without ``--trace`` (wall time of the whole run,
best of ``--repeat`` interleaved runs, each a fresh process), and the trace's size. Targets: ≤ 10% more wall
time, ≤ 20 MB. The timeline's events are recorded in both runs (the run's report shows the step timeline);
``--trace`` adds scheduling its spans and writing them. Writes bench/results/timeline_bench.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_results

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["models/gaudi/mnist.py", "--hpu", "--use-lazy-mode", "--steps", "20"]


def run(trace: str | None) -> float:
    cmd = [sys.executable, "-m", "hpu_backend.run", *(["--trace", trace] if trace else []), *SCRIPT]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    ns = p.parse_args()
    plain, traced = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        for _ in range(ns.repeat):
            plain.append(run(None))
            traced.append(run(path))
        size = os.path.getsize(path)
    result = {"steps": 20, "untraced_s": min(plain), "traced_s": min(traced),
              "overhead": min(traced) / min(plain) - 1, "trace_bytes": size,
              "runs": {"untraced_s": plain, "traced_s": traced}}
    print(f"untraced {result['untraced_s']:.2f} s, traced {result['traced_s']:.2f} s "
          f"({result['overhead']:+.1%}); trace {size / 1e6:.2f} MB")
    write_results("timeline_bench", result)


if __name__ == "__main__":
    main()
