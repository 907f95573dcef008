"""Cache-only hpurecipe commands on a 1,000-entry cache: wall time and peak RSS of a fresh process.

Each command runs as ``hpurecipe.main`` in a fresh interpreter (what the console script does), best of
``--repeat`` runs. The entries are one real recipe (the tiny MLP of tests/cli_helpers.py, warmed once)
stored under 1,000 keys. Target (issue "a thin CLI"): ≤ 0.3 s and ≤ 60 MB for each command; for
comparison, ``python -c "import torch"`` alone. Writes bench/results/cli_bench.json.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, print_table, write_results

COMMANDS = [["ls"], ["stats"], ["verify"], ["show", "{key}"], ["--help"]]
TARGET_S, TARGET_MB = 0.3, 60


def fill(cache_dir: str, entries: int) -> str:
    """A cache of ``entries`` copies of one real recipe; returns one key."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cli_helpers import cli, tiny_model

    from recipecache import CacheConfig, RecipeCache

    seed_dir = f"{cache_dir}-seed"  # beside the cache, in the same temporary directory
    cli("warm", tiny_model(tempfile.mkdtemp()), "-d", seed_dir)
    seed = RecipeCache(CacheConfig.parse(f"{seed_dir},false,1024"))
    entry = next(e for e in (seed.peek(i.key) for i in seed.entries()) if e is not None)
    cache = RecipeCache(CacheConfig.parse(f"{cache_dir},false,1024", fsync=False))
    for i in range(entries):
        cache.put(f"{i:04x}{entry.key[4:]}", entry.payload, entry.meta)
    cache.flush()
    return f"0000{entry.key[4:]}"


# The child reports its own peak RSS (VmHWM belongs to the address space exec made; rusage's maxrss
# would include the parent's size from before the exec).
WRAPPER = """
import atexit, runpy, sys
def report():
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM"))
    with open(hwm_file, "w") as f:
        f.write(hwm)
atexit.register(report)
hwm_file, target, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = target
runpy.run_module(target, run_name="__main__") if target != "-c" else exec(sys.argv.pop(1))
"""


def run(args: list[str], hwm_file: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one fresh process running ``python -m MODULE ARGS`` or ``-c CODE``."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, hwm_file, *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited with {proc.returncode}: {proc.stderr[-500:]}")
    with open(hwm_file) as f:
        return wall, int(f.read()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fill", help=argparse.SUPPRESS)  # internal: fill this cache directory, print one key
    args = ap.parse_args()
    entries, repeat = (100, 1) if args.quick else (args.entries, args.repeat)
    if args.fill:
        return print(fill(args.fill, entries))
    tmp = tempfile.mkdtemp()
    # Filled by a child: this process stays small, so its children's RSS is their own, not a fork's copy.
    key = subprocess.run([sys.executable, __file__, "--fill", f"{tmp}/cache", "--entries", str(entries)],
                         check=True, capture_output=True, text=True).stdout.split()[-1]
    env_dir = ["-d", f"{tmp}/cache"]
    results = {}
    for command in COMMANDS:
        argv = [c.format(key=key) for c in command] + (env_dir if command != ["--help"] else [])
        runs = [run(["hpurecipe.main", *argv], f"{tmp}/hwm") for _ in range(repeat)]
        results[" ".join(command).replace("{key}", "KEY")] = {"wall_s": min(r[0] for r in runs),
                                                             "rss_mb": min(r[1] for r in runs)}
    torch_runs = [run(["-c", "import torch"], f"{tmp}/hwm") for _ in range(repeat)]
    results["python -c 'import torch' (reference)"] = {"wall_s": min(r[0] for r in torch_runs),
                                                       "rss_mb": min(r[1] for r in torch_runs)}
    rows = [[name, f"{r['wall_s']:.3f}", f"{r['rss_mb']:.0f}"] for name, r in results.items()]
    print_table(f"hpurecipe on a {entries}-entry cache (fresh process, best of {repeat})",
                ["command", "wall s", "peak RSS MB"], rows)
    write_results("cli_bench" + ("_quick" if args.quick else ""),
                  {"entries": entries, "repeat": repeat, "targets": {"wall_s": TARGET_S, "rss_mb": TARGET_MB},
                   "results": results})
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
