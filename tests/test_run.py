"""The launcher (``python -m hpu_backend.run``, ``hpurecipe run``) and Intel's module names, in real processes.

Each test runs small scripts as a user would: the names resolve only under the launcher, a script's own
failure keeps its own traceback and exit code, our failures are one line, ranks get the variables torchrun
and mpirun set, a failing or hanging rank stops the others and is named, and Ctrl-C leaves a cache that
verifies clean.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli_helpers import cli, one_line
from recipecache.disk import ENTRY_SUFFIX

ROOT = Path(__file__).resolve().parent.parent


def env(**extra) -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), out.get("PYTHONPATH", "")])
    out.update(extra)
    return out


def launch(*args, cwd=None, timeout=120, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpu_backend.run", *map(str, args)], capture_output=True,
                          text=True, env=env(**extra), cwd=cwd, timeout=timeout)


def script(tmp_path: Path, text: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


NAMES = """
    import json, sys, torch, torch.distributed as dist
    import habana_frameworks.torch.core as htcore
    import habana_frameworks.torch as ht
    import habana_frameworks.torch.hpu as hthpu
    import habana_frameworks.torch.utils.debug as htdebug
    import habana_frameworks.torch.distributed.hccl as hccl
    from habana_frameworks.torch.hpex.kernels import FusedSDPA
    from habana_frameworks.torch.hpex.optimizers import FusedAdamW, FusedSGD
    from habana_frameworks.torch.hpex.normalization import FusedClipNorm
    from habana_frameworks.torch.utils.library_loader import load_habana_module
    from habana_frameworks.torch.hpu.metrics import metric_global
    import hpu_backend.gaudi as gaudi, hpu_backend.metrics as metrics
    load_habana_module()
    try:
        import habana_frameworks.torch.not_a_module
        missing = False
    except ImportError:
        missing = True
    htcore.mark_step()
    print("the script's own stdout")
    json.dump({"heavy": [m for m in ("torch._dynamo", "sympy") if m in sys.modules],  # the first compile loads them
               "argv": sys.argv[1:], "main": __name__,
               "hpu_is_torch_hpu": hthpu is torch.hpu and htcore.hpu is torch.hpu,
               "mark_step": htcore.mark_step is gaudi.mark_step, "sdpa": FusedSDPA is gaudi.FusedSDPA,
               "optimizers": [FusedAdamW is gaudi.FusedAdamW, FusedSGD is gaudi.FusedSGD,
                              FusedClipNorm is gaudi.FusedClipNorm],
               "attr_import": ht.hpex.kernels.FusedSDPA is FusedSDPA, "metrics": metric_global is metrics.metric_global,
               "permute": htcore.is_enabled_weight_permute_pass(), "hccl": "hccl" in dist.Backend.backend_list,
               "missing": missing, "world": hccl.initialize_distributed_hpu()}, open(sys.argv[1], "w"))
"""


def test_intel_names_resolve_under_the_launcher_only(tmp_path):
    path, out, report = script(tmp_path, NAMES), tmp_path / "names.json", tmp_path / "report.json"
    proc = launch("--report", report, path, out, "--hpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "the script's own stdout\n"  # the report is not on stdout
    seen = json.loads(out.read_text())
    assert seen == {"heavy": [], "argv": [str(out), "--hpu"], "main": "__main__", "hpu_is_torch_hpu": True,
                    "mark_step": True, "sdpa": True, "optimizers": [True, True, True], "attr_import": True,
                    "metrics": True,
                    "permute": True, "hccl": True, "missing": True, "world": [1, 0, 0]}  # one rank, as torchrun
    doc = json.loads(report.read_text())  # one process: the shape of N ranks, with one
    assert doc["world_size"] == 1 and [(r["rank"], r["exit_code"]) for r in doc["ranks"]] == [(0, 0)]

    plain = subprocess.run([sys.executable, "-c", "import importlib.util, hpu_backend, torch; "
                            "print(importlib.util.find_spec('habana_frameworks'), hasattr(torch, 'hpu'))"],
                           capture_output=True, text=True, env=env(), timeout=120)
    assert plain.stdout.split() == ["None", "False"], plain.stderr  # nothing active on a plain import


SPAWNS = """
    import multiprocessing, sys
    import habana_frameworks.torch.utils.library_loader as loader  # the spawned child imports this script again

    def child(path):
        import habana_frameworks.torch.core as htcore
        import hpu_backend.gaudi
        open(path, "w").write(str(htcore.mark_step is hpu_backend.gaudi.mark_step))

    if __name__ == "__main__":
        p = multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],))
        p.start()
        p.join()
        sys.exit(p.exitcode)
"""


def test_processes_the_script_spawns_see_the_names_too(tmp_path):
    """DataLoader workers of Intel's examples start with the spawn method and import the script again."""
    path, out = script(tmp_path, SPAWNS), tmp_path / "child.txt"
    proc = launch("--report", tmp_path / "r.json", path, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == "True"


def test_refuses_where_intel_stack_is_installed(tmp_path):
    fake = tmp_path / "site" / "habana_frameworks"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    path = script(tmp_path, "print('ran')\n")
    proc = launch(path, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Intel's habana_frameworks is installed" in proc.stderr, proc.stderr


def test_script_failure_is_the_scripts_own(tmp_path):
    path = script(tmp_path, """\
        import sys
        print("before")
        def inner():
            raise ValueError("the script's own error")
        if sys.argv[1:] == ["exit"]:
            sys.exit(3)
        inner()
        """)
    proc = launch(path)
    assert proc.returncode == 1 and proc.stdout == "before\n"
    trace = proc.stderr[:proc.stderr.index("ValueError: the script's own error")]
    frames = [line for line in trace.splitlines() if line.startswith("  File ")]
    assert trace.startswith("Traceback (most recent call last):")
    assert len(frames) == 2 and all(str(path) in f for f in frames), trace  # <module>, inner: as Python shows it
    assert "runpy" not in proc.stderr and "hpu_backend" not in trace
    assert "exited 1" in proc.stderr  # the report follows
    assert launch(path, "exit").returncode == 3


@pytest.mark.parametrize("args, message, code", [
    (["missing.py"], "missing.py: no such script", 1),
    (["--cards", "0", "{script}"], "--cards must be 1 or more, got 0", 2),
    (["--target", "gaudi9", "{script}"], "--target must be one of gaudi2, gaudi3, got 'gaudi9'", 2),
    (["--timeout", "0", "{script}"], "--timeout must be a number of seconds more than 0, got 0", 2),
])
def test_bad_input_is_one_line(tmp_path, args, message, code):
    path = script(tmp_path, "print('ran')\n")
    args = [a.format(script=path) for a in args]
    assert message in one_line(cli("run", *args, code=code))  # fails before running anything: in-process is safe
    proc = launch(*args, cwd=tmp_path)
    assert proc.returncode == code and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr


RANK = """
    import json, os, sys, warnings
    import torch, torch.distributed as dist
    import habana_frameworks.torch.distributed.hccl
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("hccl")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"]
    json.dump({"env": {n: os.environ.get(n) for n in names}, "backend": dist.get_backend(), "sum": t.item(),
               "warnings": [str(w.message) for w in caught]}, open(f"{sys.argv[1]}.{dist.get_rank()}", "w"))
    dist.destroy_process_group()
"""


def test_cards_start_ranks_as_a_launcher_does(tmp_path):
    path, report = script(tmp_path, RANK), tmp_path / "report.json"
    proc = launch("--cards", "2", "--report", report, path, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    port = ranks[0]["env"]["MASTER_PORT"]
    for r, seen in enumerate(ranks):
        assert seen["env"] == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMPI_COMM_WORLD_RANK": str(r),
                               "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}
        assert seen["backend"] == "hccl" and seen["sum"] == 3.0
        assert not [w for w in seen["warnings"] if "capability" in w], seen["warnings"]
    per_rank = json.loads(report.read_text())
    assert per_rank["world_size"] == 2 and [r["rank"] for r in per_rank["ranks"]] == [0, 1]


STOPS = """
    import os, sys, time
    if os.environ["RANK"] == "1":
        if sys.argv[1] == "fail":
            time.sleep(0.5)
            raise RuntimeError("rank one cannot go on")
    else:
        print("rank 0 waits", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("mode, args, message", [
    ("fail", [], "rank 1 failed (RuntimeError: rank one cannot go on); the other ranks were stopped"),
    ("hang", ["--timeout", "3"], "ranks 0, 1 still running after 3 s (--timeout); all ranks were stopped"),
])
def test_a_failing_or_hanging_rank_stops_the_others(tmp_path, mode, args, message):
    path = script(tmp_path, STOPS)
    proc = launch("--cards", "2", *args, path, mode, timeout=300)  # rank 0 would sleep 600 s if not stopped
    assert proc.returncode == 1
    ours = [line for line in proc.stderr.splitlines() if line.startswith("hpu_backend.run:")]
    assert len(ours) == 1 and ours[0].startswith(f"hpu_backend.run: error: {message}"), proc.stderr
    if mode == "hang":  # a rank stopped once its script ran says where it was (on a loaded machine, it may not yet)
        rest = ours[0].removeprefix(f"hpu_backend.run: error: {message}")
        assert re.fullmatch(r"( \(rank 0 at script\.py:9(, rank 1 at script\.py:9)?\)| \(rank 1 at script\.py:9\))?",
                            rest), rest


COMPILES = """
    import itertools, torch
    f = torch.compile(lambda x: torch.sin(x) * 2 + x.sum(), backend="hpu_backend", dynamic=False)
    for n in itertools.count(1):  # a new shape (a recipe to store) each time, until interrupted
        f(torch.randn(n % 6 + 1))
        print(n, flush=True)
"""


def test_ctrl_c_leaves_a_cache_that_verifies_clean(tmp_path):
    cache = tmp_path / "cache"
    path = script(tmp_path, COMPILES)
    proc = subprocess.Popen([sys.executable, "-m", "hpurecipe.main", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(PT_HPU_RECIPE_CACHE_CONFIG=f"{cache},false,64"))
    for line in proc.stdout:  # interrupt once a few recipes are compiled, while more are being written
        if line.strip() == "2":
            break
    deadline = time.monotonic() + 60  # and stored: the background writer publishes them, on a loaded machine late
    while not any(cache.glob(f"entries/*/*{ENTRY_SUFFIX}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert any(cache.rglob("*")), "nothing was cached before the interrupt"
    verified = json.loads(cli("verify", "--cache-dir", cache, "--json").stdout)  # exit 0: nothing bad
    assert verified["bad"] == 0 and verified["entries"] >= 1, verified


def test_initialize_distributed_hpu_reads_mpi_names(monkeypatch):
    from hpu_backend.gaudi.distributed import initialize_distributed_hpu

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # set first, so that undo removes what the call writes
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert initialize_distributed_hpu() == (8, 3, 3)
    assert initialize_distributed_hpu(2, 1, 0) == (2, 1, 0) and os.environ["RANK"] == "1"
