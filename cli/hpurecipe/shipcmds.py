"""Commands that ship a cache between machines: export and import bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpu_backend.aot.bundles import bundle_key, check_toolchain, read_bundle, write_bundle
from hpu_backend.aot.manifests import manifest_path, read_manifests, write_manifest

from . import render
from .caches import open_cache
from .errors import CliError
from .options import CacheDir, Json, Model

BundlePath = Annotated[Path, typer.Argument(help="The bundle file (a tar).", show_default=False)]


def export(bundle: BundlePath, cache_dir: CacheDir = None, model: Model = None, json: Json = False) -> None:
    """Write the cache's entries (or one model's) with their manifests and the toolchain into one file."""
    cache = open_cache(cache_dir, quiet=True)
    if cache is None:
        raise CliError("no recipe cache to export; fill it with: hpurecipe warm MODEL.py")
    keys = [i.key for i in cache.entries() if model is None or i.meta.get("model") == model]
    if not keys:
        raise CliError(f"no entries{f' for model {model}' if model else ''} to export")
    manifests = {manifest_path(cache.path, d["model"], d["mode"]).name: d for d in read_manifests(cache.path)
                 if model is None or d["model"] == model}
    key = bundle_key()
    info = write_bundle(bundle, cache, keys, manifests, key)
    size = bundle.stat().st_size
    if json:
        return render.emit_json({"bundle": str(bundle), "entries": len(info["entries"]),
                                 "manifests": info["manifests"], "bytes": size, "signed": key is not None})
    render.note("Exported {} and {} ({}) to {}{}.", render.plural(len(info["entries"]), "entry"),
                render.plural(len(manifests), "manifest"), render.size(size), bundle,
                ", signed" if key is not None else "")


def import_(bundle: BundlePath, cache_dir: CacheDir = None,
            force: Annotated[bool, typer.Option("--force", help="Import a bundle from another toolchain.")] = False,
            json: Json = False) -> None:
    """Check every entry of a bundle, then add them to the cache (entries already there are kept)."""
    found = read_bundle(bundle, bundle_key())
    differ = check_toolchain(found, force)
    cache = open_cache(cache_dir, create=True)
    added = 0
    for entry in found.entries:
        if not cache.contains(entry.key):
            cache.put(entry.key, entry.payload, entry.meta)
            added += 1
    cache.flush()
    for doc in found.manifests.values():
        if isinstance(doc, dict) and {"model", "mode", "buckets"} <= set(doc):
            write_manifest(cache.path, doc)
    if json:
        return render.emit_json({"entries": len(found.entries), "imported": added,
                                 "present": len(found.entries) - added, "manifests": len(found.manifests),
                                 "toolchain_differs": differ, "signature_checked": found.signed})
    render.note("Imported {} ({} already there) and {} into {}.", render.plural(added, "entry"),
                len(found.entries) - added, render.plural(len(found.manifests), "manifest"), cache.path)
    if differ:
        render.note("[yellow]warning:[/yellow] forced past a toolchain mismatch: {}", "; ".join(differ))
