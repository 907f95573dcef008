"""A fresh host served by the fleet tier: warming models/gpt.py's buckets from Redis vs compiling them.

Starts a private redis-server on a loopback port (needs the ``redis-server`` binary). Host A warms
the model file with the fleet tier on (it compiles and pushes); host B, with its own empty disk
cache, warms the same buckets (every recipe comes from Redis); host C pulls just the entries the
buckets need (``hpurecipe pull``) and then warms from its local disk. Each step is a fresh
``hpurecipe`` process, timed end to end, best of ``--repeat``. Writes bench/results/fleet_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from common import ROOT, print_table, write_results


def hpurecipe(*args: str, env: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hpurecipe.main", *args, "--json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return time.perf_counter() - start, json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(ROOT / "models" / "gpt.py"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("needs redis-server (apt-get install redis-server)")
    tmp = tempfile.mkdtemp()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = f"redis://127.0.0.1:{port}/0"
    env = dict(os.environ, HPU_RECIPE_CACHE_REMOTE=url)
    local = dict(os.environ, HPU_RECIPE_CACHE_REMOTE="none")
    repeat = 1 if args.quick else args.repeat
    try:
        runs: dict[str, list[float]] = {"compile (host A, pushes)": [], "warm from Redis (host B)": [],
                                        "pull (host C)": [], "warm from local disk after pull (host C)": []}
        for i in range(repeat):
            subprocess.run([sys.executable, "-c", f"import redis; redis.Redis(port={port}).flushall()"], check=True)
            t, a = hpurecipe("warm", args.model, "-d", f"{tmp}/a{i}", env=env)
            runs["compile (host A, pushes)"].append(t)
            t, b = hpurecipe("warm", args.model, "-d", f"{tmp}/b{i}", env=env)
            runs["warm from Redis (host B)"].append(t)
            assert b["compiled"] == 0, b
            t, _ = hpurecipe("pull", args.model, "-d", f"{tmp}/c{i}", env=env)
            runs["pull (host C)"].append(t)
            t, c = hpurecipe("warm", args.model, "-d", f"{tmp}/c{i}", env=local)
            runs["warm from local disk after pull (host C)"].append(t)
            assert c["compiled"] == 0, c
    finally:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {k: min(v) for k, v in runs.items()}
    ref = best["compile (host A, pushes)"]
    rows = [[k, f"{v:.2f}", f"{v / ref:.2f}"] for k, v in best.items()]
    print_table(f"fleet tier, {os.path.basename(args.model)}, {a['buckets']} shape points, {a['recipes']} recipes "
                f"(fresh hpurecipe processes, best of {repeat})", ["step", "seconds", "ratio to compile"], rows)
    write_results("fleet_bench" + ("_quick" if args.quick else ""),
                  {"model": os.path.basename(args.model), "points": a["buckets"], "recipes": a["recipes"],
                   "seconds": best, "ratio_to_compile": {k: v / ref for k, v in best.items()}})


if __name__ == "__main__":
    main()
