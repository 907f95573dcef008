"""Memory of ``hpurecipe perf-tool`` over a large trace: the peak resident size of a fresh process reading a
generated step-timeline trace of ``--steps`` steps (two events each), against the trace's size. Target (issue
46): bounded memory whatever the trace's size (it held 1.7 GB for a 300 MB trace). Writes
bench/results/perftool_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, print_table, write_results


def write_trace(path: str, steps: int) -> None:
    """A trace in our layout: a device process, a Steps row with each step's parts, one MME kernel per step."""
    step_args = {"time_s": 1e-3, "host_s": 5e-4, "dispatch_s": 1e-4, "input_s": 0.0, "device_s": 9e-4,
                 "sync_s": 1e-5, "compile_s": 0.0, "engines": {"MME": 1e-4, "TPC": 2e-4}, "waits": {"copy": 0}}
    with open(path, "w") as f:
        f.write('{"otherData": {"producer": "bench"}, "traceEvents": [\n')
        f.write(json.dumps({"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "/device:HPU:0"}}))
        f.write(",\n" + json.dumps({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "Steps"}}))
        for i in range(steps):
            f.write(",\n" + json.dumps({"ph": "X", "pid": 1, "tid": 1, "name": f"step {i}", "cat": "Steps",
                                        "ts": i * 10.0, "dur": 9.0, "args": step_args}))
            f.write(",\n" + json.dumps({"ph": "X", "pid": 2, "tid": 2, "name": "mm", "cat": "MME", "ts": i * 10.0,
                                        "dur": 1.0, "args": {"recipe": "r", "estimate": True}}))
        f.write("\n]}\n")


def peak_rss_mb(trace: str) -> float:
    """Peak resident MB of ``hpurecipe perf-tool --trace TRACE --json`` in a process of its own."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    code = ("import resource, sys; from hpurecipe.main import app\n"
            f"sys.argv = ['hpurecipe', 'perf-tool', '--trace', {trace!r}, '--json']\n"
            "try:\n    app(prog_name='hpurecipe')\nexcept SystemExit as e:\n    assert not e.code\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"perf-tool failed: {proc.stderr[-500:]}")
    return int(proc.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 100_000, 500_000])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.steps:
            path = os.path.join(tmp, f"trace{steps}.json")
            write_trace(path, steps)
            rows.append({"steps": steps, "trace_mb": round(os.path.getsize(path) / 1e6, 1),
                         "peak_rss_mb": round(peak_rss_mb(path), 1)})
            os.unlink(path)
    print_table("perf-tool memory", ["steps", "trace MB", "peak RSS MB"],
                [[r["steps"], r["trace_mb"], r["peak_rss_mb"]] for r in rows])
    write_results("perftool_bench", {"rows": rows})


if __name__ == "__main__":
    main()
