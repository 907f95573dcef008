"""Ahead-of-time tools over a model file: plain functions that take configuration objects and
return dataclasses (the CLI only parses arguments and renders what they return).

``warm.py`` (warm, prebuild, plan, and ``warmup`` for serving processes), ``package.py`` (torch.export →
package), ``precompile.py`` / ``precompiled.py`` (torch's aot_compile → signed artifacts, and
``load_precompiled``), ``analyze.py`` (per-bucket analysis, largest batch), ``capacity.py`` (prefill/decode planning
without weights), ``coverage.py`` (which points a cache covers), ``cachefit.py`` (whether a cache kept
what a warm-up built), ``fleet.py`` (push, pull and manifests through the fleet tier), ``manifests.py``
(which entries serve which shape point; torch-free), ``cachepolicy.py`` (the cache configuration the
tools use; torch-free), ``bundles.py`` (export/import files, optionally signed; torch-free). Names load
their module on first use, so that reading manifests never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"PackageReport": "package", "build_package": "package", "export_model": "package",
            "prebuild": "warm", "plan": "warm", "warmup": "warm", "WarmReport": "warm",
            "read_manifests": "manifests", "write_manifest": "manifests", "manifest": "manifests",
            "analyze_spec": "analyze"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpu_backend.aot' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
