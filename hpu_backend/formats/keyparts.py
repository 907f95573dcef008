"""What a key is made of, readable without torch: its parts, the toolchain, and why two keys differ.

The cache-only commands of ``hpurecipe`` (``ls``, ``show``, ``explain``, ``export``, ...) use this
module and never import torch; ``keys.py`` computes the parts from graphs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from typing import Any

from .recipe import FORMAT_VERSION
from ..version import __version__

PARTS = ("graph", "inputs", "guards", "bucket", "settings", "toolchain")


def torch_version() -> str:
    """torch's version: from the module when it is loaded, else from its installed metadata (same string)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def toolchain() -> dict[str, Any]:
    """What produced a recipe: a recipe built by another toolchain is never used."""
    return {"torch": torch_version(), "hpu_backend": __version__, "recipe_format": FORMAT_VERSION}


def toolchain_id() -> str:
    """A short name for this toolchain (the fleet tier's namespace: two torch versions never share one)."""
    text = ",".join(f"{k}={v}" for k, v in sorted(toolchain().items()))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def differing(parts_a: dict[str, str], parts_b: dict[str, str]) -> list[str]:
    """The key parts that differ between two entries' recorded part hashes, in PARTS order."""
    return [p for p in PARTS if parts_a.get(p) != parts_b.get(p)]


def explain(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[dict[str, Any]]:
    """Why two cached entries have different keys, from their stored metadata: one row ``{"part", "a", "b"}``
    per differing part, with the readable values where recorded (settings, toolchain, bucket), else hashes."""
    rows = []
    for part in differing(meta_a.get("key_parts", {}), meta_b.get("key_parts", {})):
        da, db = meta_a.get("key_detail", {}).get(part), meta_b.get("key_detail", {}).get(part)
        rows.append({"part": part,
                     "a": da if da is not None else meta_a.get("key_parts", {}).get(part),
                     "b": db if db is not None else meta_b.get("key_parts", {}).get(part)})
    return rows
