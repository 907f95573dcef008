"""Lowering: aten FX graph → Recipe (the pipeline is in ``pipeline.py``; passes in ``passes/``).

Each name loads its module on first use: serving a stored program needs the context, the errors and the capture
pass's readers, never the pipeline and its passes (a hit does not import them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LoweringContext": "context", "LoweringError": "errors",
    "constant_of": "passes.capture", "encode_guards": "passes.capture", "recorded_annotations": "passes.capture",
    "symbol_table": "passes.capture",
    "BUCKET_PASSES": "pipeline", "GRAPH_PASSES": "pipeline", "Lowered": "pipeline", "capture_graph": "pipeline",
    "lower": "pipeline", "lower_bucket": "pipeline", "lower_graph": "pipeline",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
