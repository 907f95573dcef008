"""The ``habana-torch-plugin`` distribution of the simulated release, for clients that ask for it by name.

Optimum Habana reads the Gaudi software version from ``pip list | grep habana-torch-plugin`` in a shell, and
other tools from ``importlib.metadata.version("habana-torch-plugin")``. A meta path finder cannot answer a
second process, so ``publish()`` writes a bare ``.dist-info`` folder (metadata only, no code and no package
of that name) to a private temporary directory, puts it last on ``sys.path`` and on ``PYTHONPATH`` (so that
the ``pip`` a script starts lists it), and removes it when the process exits. Called by ``names.simulate()``
only: a plain ``import hpu_backend`` publishes nothing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .. import envs
from ..device.release import release

NAME = "habana-torch-plugin"
ENV = "HPU_BACKEND_DIST_PATH"  # the published folder, inherited by the processes the script starts


def publish(env: dict | None = None) -> str:
    """Make ``habana-torch-plugin`` of the simulated release (``HPU_SIM_RELEASE``, ``device/release.py``) visible
    here and in child processes; the folder holding it. Idempotent: a process that inherits a published folder
    (a rank, a spawned worker) reuses it."""
    env = os.environ if env is None else env
    inherited = envs.get(ENV, env)
    folder = inherited if inherited and _holds_metadata(inherited) else _write()
    if folder not in sys.path:
        sys.path.append(folder)  # last: never in front of a real installation's metadata
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, folder])
    env[ENV] = folder
    return folder


def _remove(folder: str, owner: int) -> None:
    """At exit of the process that wrote it (a forked child that runs its exit handlers leaves it)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _holds_metadata(folder: str) -> bool:
    return (Path(folder) / _dist_info() / "METADATA").is_file()


def _dist_info() -> str:
    return f"{NAME.replace('-', '_')}-{release()}.dist-info"


def _write() -> str:
    folder = tempfile.mkdtemp(prefix="hpu_backend_dist_")
    atexit.register(_remove, folder, os.getpid())
    info = Path(folder) / _dist_info()
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {release()}\n"
                                   "Summary: The simulated Intel Gaudi PyTorch bridge (hpu_backend)\n")
    (info / "INSTALLER").write_text("hpu_backend\n")
    (info / "RECORD").write_text("")
    return folder
