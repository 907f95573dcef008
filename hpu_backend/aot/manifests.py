"""Manifests: which cache entries serve each shape point of a model file (model → point → keys).

Written by ``warm``/``prebuild`` into ``<cache>/manifests/``; read by ``coverage``, ``export`` and
``import``. Plain JSON; this module does not import torch.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats.keyparts import toolchain

if TYPE_CHECKING:
    from .modelfile import ModelSpec
    from .warm import WarmReport

MANIFEST_DIR = "manifests"


def manifest_name(model: str, mode: str) -> str:
    """``<model>.<mode>.json``, made safe as a file name (it may come from a bundle)."""
    name = re.sub(r"[^0-9A-Za-z_.-]", "_", f"{model}.{mode}").lstrip(".") or "model"
    return f"{name}.json"


def manifest_path(cache_dir: Path, model: str, mode: str) -> Path:
    """``<cache>/manifests/<model>.<mode>.json``."""
    return Path(cache_dir) / MANIFEST_DIR / manifest_name(model, mode)


def manifest(report: WarmReport, spec: ModelSpec) -> dict[str, Any]:
    """model → point → entry keys (its recipes and programs), with the toolchain and compile arguments."""
    return {"model": report.model, "mode": report.mode, "file": spec.path, "source_hash": spec.source_hash,
            "toolchain": toolchain(), "compile": {"dynamic": spec.dynamic, "options": spec.options},
            "axes": spec.axes, "created": time.time(),
            "buckets": {p.label: sorted(p.keys + p.programs) for p in report.points}}


def write_manifest(cache_dir: Path, doc: dict[str, Any]) -> Path:
    """Write (atomically) ``<cache>/manifests/<model>.<mode>.json``; returns its path.

    Buckets already listed there under the same toolchain are kept (a warm of a few axes values
    adds to the manifest instead of replacing it).
    """
    path = manifest_path(cache_dir, doc["model"], doc["mode"])
    old = _read_json(path)
    if isinstance(old, dict) and old.get("toolchain") == doc.get("toolchain") and isinstance(old.get("buckets"), dict):
        doc = dict(doc, buckets={**old["buckets"], **doc["buckets"]})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)
    return path


def read_manifests(cache_dir: Path) -> list[dict[str, Any]]:
    """Every readable manifest in a cache directory (unreadable ones are skipped)."""
    docs = [_read_json(path) for path in sorted((Path(cache_dir) / MANIFEST_DIR).glob("*.json"))]
    return [doc for doc in docs if isinstance(doc, dict) and isinstance(doc.get("buckets"), dict)]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
