"""Manifests: which cache entries serve each shape point of a model file (model → point → keys).

Written by ``warm``/``prebuild`` into ``<cache>/manifests/`` and sent to the fleet tier (``send_manifest``,
``put_manifest``); read by ``coverage``, ``export``, ``import`` and ``pull``. Plain JSON; this module does not
import torch (``send_manifest`` is handed the cache of the run's store).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipecache import RecipeCache
from recipecache.remote import RemoteTier
from recipecache.safeio import read_small, write_atomic

from ..formats.keyparts import toolchain, toolchain_id

if TYPE_CHECKING:
    from ..modelfiles.modelspec import ModelSpec
    from .reports import WarmReport

MANIFEST_DIR = "manifests"
MAX_MANIFEST = 4 * 1024 * 1024  # a manifest lists keys: KBs


def manifest_name(model: str, mode: str) -> str:
    """``<model>.<mode>.json``, made safe as a file name (it may come from a bundle)."""
    name = re.sub(r"[^0-9A-Za-z_.-]", "_", f"{model}.{mode}").lstrip(".") or "model"
    return f"{name}.json"


def manifest_path(cache_dir: Path, model: str, mode: str) -> Path:
    """``<cache>/manifests/<model>.<mode>.json``."""
    return Path(cache_dir) / MANIFEST_DIR / manifest_name(model, mode)


def manifest(report: WarmReport, spec: ModelSpec) -> dict[str, Any]:
    """model → point → entry keys (its recipes and programs), with the toolchain and compile arguments; a point
    built on several ranks lists the entries of all of them."""
    buckets: dict[str, set[str]] = {}
    for p in report.points:
        buckets.setdefault(p.label, set()).update(p.keys, p.programs)
    return {"model": report.model, "mode": report.mode, "file": spec.path, "source_hash": spec.source_hash,
            "toolchain": toolchain(), "compile": {"dynamic": spec.dynamic, "options": spec.options},
            "axes": spec.axes, "created": time.time(),
            "buckets": {label: sorted(keys) for label, keys in buckets.items()}}


def write_manifest(cache_dir: Path, doc: dict[str, Any]) -> Path:
    """Write (atomically) ``<cache>/manifests/<model>.<mode>.json``; returns its path.

    Buckets already listed there under the same toolchain are kept (a warm of a few axes values
    adds to the manifest instead of replacing it).
    """
    path = manifest_path(cache_dir, doc["model"], doc["mode"])
    _manifest_dir(cache_dir, create=True)
    old = _read_json(path)
    if isinstance(old, dict) and old.get("toolchain") == doc.get("toolchain") and isinstance(old.get("buckets"), dict):
        doc = dict(doc, buckets={**old["buckets"], **doc["buckets"]})
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=str).encode())
    return path


def read_manifests(cache_dir: Path) -> list[dict[str, Any]]:
    """Every readable manifest in a cache directory (unreadable ones are skipped)."""
    try:
        directory = _manifest_dir(cache_dir, create=False)
    except OSError:  # none yet, or a link: nothing is read through it
        return []
    docs = [_read_json(path) for path in sorted(directory.glob("*.json"))]
    return [doc for doc in docs if isinstance(doc, dict) and isinstance(doc.get("buckets"), dict)]


def _manifest_dir(cache_dir: Path, create: bool) -> Path:
    """``<cache>/manifests``, made (0700) with ``create``; OSError if it is missing, or is a symbolic link or
    anything else than a directory: nothing is ever written or read through a link."""
    directory = Path(cache_dir) / MANIFEST_DIR
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    if not stat.S_ISDIR(os.lstat(directory).st_mode):
        raise OSError(errno.ENOTDIR, "not a directory (a symbolic link is never followed)", str(directory))
    return directory


def _read_json(path: Path) -> Any:
    """The JSON in a regular file of at most MAX_MANIFEST bytes (read without following a link or blocking)."""
    try:
        return json.loads(read_small(path, MAX_MANIFEST))
    except (OSError, ValueError, RecursionError):
        return None


def send_manifest(cache: RecipeCache, doc: dict[str, Any]) -> bool:
    """Send a warm-up's manifest to the cache's fleet tier, through the tier the run used (if it failed, it
    has said so once already, and says nothing more); False if it is unavailable."""
    config = cache.config
    remote = cache.remote if cache.remote is not None else RemoteTier(config.remote, config.remote_ttl_s,
                                                                      toolchain_id())
    return put_manifest(remote, doc)


def put_manifest(remote: RemoteTier, doc: dict[str, Any]) -> bool:
    """Send one manifest to the fleet tier under its file name; False if the tier is unavailable."""
    return remote.put_doc(manifest_name(doc["model"], doc["mode"]), json.dumps(doc).encode())
