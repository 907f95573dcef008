"""Run a Gaudi script unchanged on the simulated ``hpu`` device: Intel's module names on request
(``simulate``), the launcher for one or N cards (``launch``), and the end-of-run report.

``python -m hpu_backend.run SCRIPT [ARGS...]`` and ``hpurecipe run`` start here; importing this package
activates nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"simulate": "names", "launch": "launcher", "run_script": "script", "RunError": "errors"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpu_backend.run' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
