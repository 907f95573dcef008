"""delete_on_start coordination: processes of one start clear the directory once, then never again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .locks import write_atomic

# Children (fork, spawn or subprocess) inherit the session start, so they count as starting with their parent.
SESSION_ENV = "HPU_RECIPE_CACHE_SESSION_START"
# Independent processes launched together (e.g. by mpirun) import within this window of each other.
START_WINDOW_S = 30.0
_IMPORT_TIME = time.time()


def session_start() -> float:
    """When this process's session began: inherited from the environment, else when this module loaded."""
    try:
        return float(os.environ[SESSION_ENV])
    except (KeyError, ValueError):
        return _IMPORT_TIME


def claim_session() -> None:
    """Publish the session start to child processes started from now on."""
    os.environ.setdefault(SESSION_ENV, repr(session_start()))


def should_clear(marker: float | None, start: float, window_s: float = START_WINDOW_S) -> bool:
    """Clear only if no process of this start (or one within the window before it) has cleared already."""
    return marker is None or marker < start - window_s


def read_marker(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def write_marker(path: Path) -> None:
    write_atomic(path, repr(time.time()).encode())
