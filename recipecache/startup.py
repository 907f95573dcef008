"""delete_on_start coordination: the processes of one launch clear the directory once; every new launch
of the workload clears it again (Gaudi's "clear the cache when the workload starts").

A launch is named by, in order: ``HPU_RECIPE_CACHE_LAUNCH_ID`` (set it to start a group of processes by
hand), the launcher's own job id (torchrun, PMIx-based mpirun, Slurm), else the first process that
opens a cache: it publishes its id to the processes it starts (fork, spawn or subprocess).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .safeio import read_small, write_atomic

LAUNCH_ENV = "HPU_RECIPE_CACHE_LAUNCH_ID"
# (variable, value that means "not set") for launchers that name one launch of a job.
_LAUNCHERS = (("TORCHELASTIC_RUN_ID", "none"), ("PMIX_NAMESPACE", ""), ("SLURM_JOB_ID", ""))
_OWN = f"pid-{os.getpid()}-{time.time_ns()}"


def launch_id(environ=None) -> str:
    """The id of the launch this process belongs to."""
    env = os.environ if environ is None else environ
    if env.get(LAUNCH_ENV):
        return env[LAUNCH_ENV]
    for name, unset in _LAUNCHERS:
        value = env.get(name, "")
        if value and value != unset:
            step = env.get("SLURM_STEP_ID", "") if name == "SLURM_JOB_ID" else ""
            return f"{name}={value}" + (f".{step}" if step else "")
    return _OWN


def claim_launch() -> None:
    """Publish the launch id to child processes started from now on."""
    os.environ.setdefault(LAUNCH_ENV, launch_id())


def should_clear(marker: str | None, launch: str) -> bool:
    """Clear unless a process of this launch has cleared already."""
    return marker != launch


def read_marker(path: Path) -> str | None:
    try:
        return read_small(path, 4096).decode()
    except (OSError, UnicodeDecodeError):
        return None


def write_marker(path: Path, launch: str) -> None:
    write_atomic(path, launch.encode())
