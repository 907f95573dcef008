"""Start-up of the launcher: time from starting ``hpurecipe run SCRIPT`` (and ``python -m hpu_backend.run SCRIPT``)
to the script's first line, against ``python SCRIPT`` whose first line comes after ``import torch``.

The script's first line writes ``time.time()``; each fresh process is timed from just before it is started,
and the CPU seconds the process had used by then (less moved by other work on a shared machine), each the
best of ``--repeat`` rounds in which the commands take turns (a shared machine's load moves between rounds, not
between commands). Python modules run from their compiled bytecode, as an installed package's do (one untimed
run first writes it, whatever ``PYTHONDONTWRITEBYTECODE`` says). Target (issue 33): the launcher's start-up
≤ 0.5 s beyond ``import torch``. Writes bench/results/startup_bench.json.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time

from common import ROOT, print_table, write_results

TARGET_S = 0.5
FIRST_LINE = "import time, sys; open(sys.argv[1], 'w').write(repr((time.time(), time.process_time())))\n"
AFTER_TORCH = "import torch\n" + FIRST_LINE
BASELINE = "python SCRIPT (import torch, then the first line)"


def to_first_line(cmd: list[str], stamp: str) -> tuple[float, float]:
    """Wall seconds from starting ``cmd`` to its script's first line, and the CPU seconds it had used by then."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH",
                                                                                                     "")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.time()
    proc = subprocess.run([*cmd, stamp], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}: {proc.stderr[-500:]}")
    with open(stamp) as f:
        wall, cpu = ast.literal_eval(f.read())
    return wall - start, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeat = 2 if args.quick else args.repeat
    tmp = tempfile.mkdtemp()
    plain, torch_first = os.path.join(tmp, "first_line.py"), os.path.join(tmp, "torch_first.py")
    open(plain, "w").write(FIRST_LINE)
    open(torch_first, "w").write(AFTER_TORCH)
    cases = {BASELINE: [sys.executable, torch_first],
             "python -m hpu_backend.run SCRIPT": [sys.executable, "-m", "hpu_backend.run", plain],
             "hpurecipe run SCRIPT": [sys.executable, "-m", "hpurecipe.main", "run", plain]}
    stamp = os.path.join(tmp, "stamp")
    for cmd in cases.values():
        to_first_line(cmd, stamp)  # writes the bytecode
    rounds = [{name: to_first_line(cmd, stamp) for name, cmd in cases.items()} for _ in range(repeat)]
    results = {name: min(r[name][0] for r in rounds) for name in cases}
    cpu = {name: min(r[name][1] for r in rounds) for name in cases}  # less moved by other work than wall time
    base, base_cpu = results[BASELINE], cpu[BASELINE]
    over = {name: s - base for name, s in results.items() if name != BASELINE}
    over_cpu = {name: s - base_cpu for name, s in cpu.items() if name != BASELINE}
    rows = [[name, f"{results[name]:.3f}", "" if name == BASELINE else f"+{over[name]:.3f}", f"{cpu[name]:.3f}",
             "" if name == BASELINE else f"+{over_cpu[name]:.3f}"] for name in cases]
    print_table(f"seconds to the script's first line (fresh process, best of {repeat})",
                ["command", "wall s", "beyond import torch", "CPU s", "CPU beyond import torch"], rows)
    write_results("startup_bench" + ("_quick" if args.quick else ""),
                  {"repeat": repeat, "load_average_1m": os.getloadavg()[0],  # a shared machine's noise
                   "target_beyond_torch_s": TARGET_S, "to_first_line_s": results,
                   "beyond_import_torch_s": over, "cpu_to_first_line_s": cpu, "cpu_beyond_import_torch_s": over_cpu})


if __name__ == "__main__":
    main()
