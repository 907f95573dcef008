"""Gaudi-style scripts (``models/gaudi/``) through the launcher, as real processes, against the same scripts
on the CPU: lazy, eager, autocast, torch.compile, DDP over 2 ranks, checkpoint save and resume, weight
sharing, FusedSDPA; and the device's refusals (out of memory, strict fallback) as one line.

The CPU references run in one process (each script as ``__main__`` in turn); the device runs start together,
two at a time, in a module fixture, and each test reads its results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)

ROOT = Path(__file__).resolve().parent.parent
GAUDI = ROOT / "models" / "gaudi"
STEPS = 4
RESUMED = 2  # steps the resumed run adds after the lazy run's checkpoint

# name -> (script, its arguments, launcher options, environment)
REFERENCES = {
    "mnist": ("mnist.py", []), "mnist_autocast": ("mnist.py", ["--autocast"]),
    "mnist_b32": ("mnist.py", ["--batch-size", "32"]), "weights": ("weight_sharing.py", []), "sdpa": ("sdpa.py", []),
}
DEVICE_RUNS = {
    "lazy": ("mnist.py", ["--hpu", "--use-lazy-mode", "--save-model", "{tmp}/ckpt.pt"], [], {}),
    "eager": ("mnist.py", ["--hpu"], [], {"PT_HPU_LAZY_MODE": "0"}),
    "autocast": ("mnist.py", ["--hpu", "--use-lazy-mode", "--autocast"], [], {}),
    "compile": ("mnist.py", ["--hpu", "--use-torch-compile"], [], {}),  # eager: the default from software 1.21
    "ddp": ("mnist.py", ["--hpu", "--use-lazy-mode", "--distributed"], ["--cards", "2"], {}),
    "ddp_compile": ("mnist.py", ["--hpu", "--use-torch-compile", "--distributed"], ["--cards", "2"],
                    {"PT_HPU_LAZY_MODE": "0"}),
    "ddp_compile_lazy": ("mnist.py", ["--hpu", "--use-lazy-mode", "--use-torch-compile", "--distributed"],
                         ["--cards", "2"], {}),
    "weights": ("weight_sharing.py", ["--hpu"], [], {"PT_HPU_LAZY_MODE": "1"}),
    "sdpa": ("sdpa.py", ["--hpu"], [], {"PT_HPU_LAZY_MODE": "1"}),
}
DRIVER = """
import json, runpy, sys
for script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
"""


def env(**extra) -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), out.get("PYTHONPATH", "")])
    out.pop("PT_HPU_LAZY_MODE", None)
    out.update(extra)
    return out


def losses(path: Path) -> list[float]:
    return json.loads(path.read_text())["losses"]


def _references(tmp: Path) -> subprocess.CompletedProcess:
    runs = [(str(GAUDI / script), [*args, "--steps", str(STEPS + RESUMED), "--losses", str(tmp / f"cpu_{name}.json")])
            for name, (script, args) in REFERENCES.items()]
    return subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True,
                          env=env(), timeout=600)


def _device_run(tmp: Path, name: str) -> subprocess.CompletedProcess:
    script, args, options, extra = DEVICE_RUNS[name]
    args = [a.format(tmp=tmp) for a in args]
    cmd = [sys.executable, "-m", "hpurecipe.main", "run", *options, "--report", str(tmp / f"report_{name}.json"),
           str(GAUDI / script), *args, "--steps", str(STEPS), "--losses", str(tmp / f"hpu_{name}.json")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(**extra), timeout=600, cwd=tmp)


def _resume(tmp: Path, lazy) -> subprocess.CompletedProcess:
    """After the lazy run (a future): the same script from its checkpoint, RESUMED steps further."""
    lazy.result()
    cmd = [sys.executable, "-m", "hpu_backend.run", str(GAUDI / "mnist.py"), "--hpu", "--use-lazy-mode",
           "--steps", str(STEPS + RESUMED), "--checkpoint", str(tmp / "ckpt.pt"), "--losses", str(tmp / "resumed.json")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600, cwd=tmp)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of this module: name -> finished process (``"cpu"`` is the references' process)."""
    tmp = tmp_path_factory.mktemp("gaudi_scripts")
    with ThreadPoolExecutor(2) as pool:
        cpu = pool.submit(_references, tmp)
        device = {name: pool.submit(_device_run, tmp, name) for name in DEVICE_RUNS}
        device["resumed"] = pool.submit(_resume, tmp, device["lazy"])
        done = {name: f.result() for name, f in device.items()}
    done["cpu"] = cpu.result()
    assert done["cpu"].returncode == 0, done["cpu"].stderr[-3000:]
    return tmp, done


def _ok(runs, name) -> tuple[Path, dict]:
    tmp, done = runs
    proc = done[name]
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp, json.loads((tmp / f"report_{name}.json").read_text())


@pytest.mark.parametrize("name, reference, mode, rtol", [
    ("lazy", "mnist", "lazy", 1e-4), ("eager", "mnist", "eager", 1e-4), ("compile", "mnist", "eager", 1e-4),
    ("autocast", "mnist_autocast", "lazy", 3e-2),  # bf16 on both sides, by different op lists
    ("weights", "weights", "lazy", 1e-4), ("sdpa", "sdpa", "lazy", 1e-4),
])
def test_a_gaudi_script_tracks_the_cpu(runs, name, reference, mode, rtol):
    tmp, doc = _ok(runs, name)
    (report,) = doc["ranks"]  # one process: the --report shape of N ranks, with one
    got, want = losses(tmp / f"hpu_{name}.json"), losses(tmp / f"cpu_{reference}.json")
    assert len(got) == STEPS
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want[:STEPS]), rtol=rtol, atol=rtol)
    assert report["mode"] == mode and report["exit_code"] == 0 and report["release"] == "1.22.0"


@pytest.mark.parametrize("name, mode", [("ddp", "lazy"), ("ddp_compile", "eager"), ("ddp_compile_lazy", "lazy")])
def test_ddp_over_two_ranks_tracks_one_cpu_process_with_both_batches(runs, name, mode):
    """DDP, alone and around a compiled model (its gradient buckets are device tensors the compiled backward
    writes), in each mode."""
    tmp, report = _ok(runs, name)
    ranks = [losses(tmp / f"hpu_{name}.json.rank{r}") for r in range(2)]
    mean = [(a + b) / 2 for a, b in zip(*ranks)]  # equal shards: the mean of the ranks' losses is the global loss
    torch.testing.assert_close(torch.tensor(mean), torch.tensor(losses(tmp / "cpu_mnist_b32.json")[:STEPS]),
                               rtol=1e-4, atol=1e-4)
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and all(r["mode"] == mode for r in report["ranks"])
    for r in report["ranks"]:  # DDP's bucket all-reduces are on each rank's timeline, with no hook to attach
        assert sum(s["engines"].get("Network", 0) for s in r["timeline"]["steps"]) > 0


def test_checkpoint_save_and_resume_continue_the_run(runs):
    tmp, done = runs
    assert done["resumed"].returncode == 0, done["resumed"].stderr[-3000:]
    state = torch.load(tmp / "ckpt.pt", map_location="cpu")  # saved on the device, loadable anywhere
    assert state["step"] == STEPS and all(t.device.type == "cpu" for t in state["model"].values())
    torch.testing.assert_close(torch.tensor(losses(tmp / "resumed.json")),
                               torch.tensor(losses(tmp / "cpu_mnist.json")[STEPS:]), rtol=1e-4, atol=1e-4)


REFUSED = """
    import sys, torch
    import habana_frameworks.torch.core as htcore
    if sys.argv[1] == "oom":
        x = torch.empty(4 << 20, dtype=torch.uint8, device="hpu")  # 4 MiB on a card of 1 MiB
    else:
        x = torch.ones(4, 4, dtype=torch.float64, device="hpu") @ torch.ones(4, 4, dtype=torch.float64, device="hpu")
    print(x.sum().item())
"""


@pytest.mark.parametrize("case, extra, words", [
    ("oom", {"HPU_BACKEND_HBM_BYTES": str(1 << 20)}, "out of memory"),
    ("strict", {"HPU_BACKEND_STRICT": "1", "PT_HPU_LAZY_MODE": "0"}, "float64"),
])
def test_the_devices_refusals_are_one_line(tmp_path, case, extra, words):
    path = tmp_path / "refused.py"
    path.write_text(textwrap.dedent(REFUSED))
    proc = subprocess.run([sys.executable, "-m", "hpu_backend.run", "--report", str(tmp_path / "r.json"), str(path),
                           case], capture_output=True, text=True, env=env(**extra), timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0].lower() and "(at refused.py:" in lines[0], proc.stderr
