"""The client tests: Optimum Habana and DeepSpeed, unchanged, as real scripts under ``python -m hpu_backend.run``.

They need the ``[clients]`` extra (optimum-habana pins transformers 4.55, the main suite's extra wants 5), so
they run in their own venv and CI step (``.ci/run``); where the clients are not installed (the main suite's
venv) this folder is not collected.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
SITE = HERE / "site"

if any(importlib.util.find_spec(name) is None for name in ("optimum", "deepspeed")):
    collect_ignore_glob = ["test_*.py"]  # the main suite's venv: these run in the clients' own step
else:
    sys.path[:0] = [str(SCRIPTS), str(SITE)]
    import sitecustomize  # noqa: E402,F401  - torchvision importable here too (see site/sitecustomize.py)


def client_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a client script: an activated venv (its ``pip`` first on PATH, as Optimum runs
    ``pip list``), the test site folder, no hub access, caches under ``tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # hpu_backend itself: the copy the tests import (CI: the installed wheel; a checkout on the caller's PYTHONPATH)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
    env.pop("PYTHONSAFEPATH", None)  # CI's: a script run as `python SCRIPT` finds its own folder's modules
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp / "hf"), TOKENIZERS_PARALLELISM="false",
               PT_HPU_RECIPE_CACHE_CONFIG=f"{tmp / 'recipes'},false,1024")
    env.update(extra)
    return env


def run_client(tmp: Path, script: str, *args, cards: int | None = None, launcher: bool = True,
               torchrun: int | None = None, timeout: float = 400, **env: str) -> subprocess.CompletedProcess:
    """Run ``scripts/SCRIPT ARGS`` with this Python, under the launcher unless ``launcher`` is False (``torchrun``:
    that many processes under torch's own launcher on a free port, the CPU's reference of several ranks); a
    failure shows the run's last output."""
    command = [sys.executable, str(SCRIPTS / script), *map(str, args)]
    if torchrun:
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)]
    elif launcher:
        command[1:1] = ["-m", "hpu_backend.run", *(["--cards", str(cards)] if cards else [])]
    proc = subprocess.run(command, env=client_env(tmp, **env), cwd=tmp, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{script} {args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-6000:]}")
    return proc


@pytest.fixture
def client(tmp_path):
    return lambda script, *args, **kw: run_client(tmp_path, script, *args, **kw)
