"""Commands that ship a cache between machines: export and import bundles; push to and pull from the
fleet tier (Redis)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hpu_backend.shipping.bundles import bundle_key, check_toolchain, read_bundle, unusable, write_bundle
from hpu_backend.shipping.manifests import manifest_name, read_manifests, write_manifest

from . import render
from .precompilecmds import precompiled_files, write_precompiled
from .caches import open_cache
from .errors import CliError
from .options import Axis, CacheDir, Json, Model, ModelFile, Remote, Train

BundlePath = Annotated[Path, typer.Argument(help="The bundle file (a tar).", show_default=False)]


Precompiled = Annotated[Optional[Path], typer.Option(
    "--precompiled", help="export: also ship this precompiled directory (hpurecipe precompile); import: write the "
    "bundle's precompiled directory here.", show_default=False)]


def export(bundle: BundlePath, cache_dir: CacheDir = None, model: Model = None, precompiled: Precompiled = None,
           json: Json = False) -> None:
    """Write the cache's entries (or one model's) with their manifests and the toolchain into one file, and a
    precompiled directory if given."""
    cache = open_cache(cache_dir, quiet=True, inspect=True)
    if cache is None and precompiled is None:
        raise CliError("no recipe cache to export; fill it with: hpurecipe warm MODEL.py")
    keys = [] if cache is None else [i.key for i in cache.entries() if model is None or i.meta.get("model") == model]
    if not keys and precompiled is None:
        raise CliError(f"no entries{f' for model {model}' if model else ''} to export")
    manifests = {} if cache is None else {manifest_name(d["model"], d["mode"]): d for d in read_manifests(cache.path)
                                         if model is None or d["model"] == model}
    files = precompiled_files(precompiled) if precompiled is not None else {}
    key = bundle_key()
    info = write_bundle(bundle, cache, keys, manifests, key, files)
    size = bundle.stat().st_size
    if json:
        return render.emit_json({"bundle": str(bundle), "entries": len(info["entries"]),
                                 "manifests": info["manifests"], "precompiled": info["precompiled"], "bytes": size,
                                 "signed": key is not None})
    render.note("Exported {} and {}{} ({}) to {}{}.", render.plural(len(info["entries"]), "entry"),
                render.plural(len(manifests), "manifest"),
                f", and {precompiled} ({render.plural(len(files) - 1, 'artifact')})" if files else "",
                render.size(size), bundle, ", signed" if key is not None else "")


def import_(bundle: BundlePath, cache_dir: CacheDir = None,
            force: Annotated[bool, typer.Option("--force", help="Import a bundle from another toolchain.")] = False,
            precompiled: Precompiled = None, json: Json = False) -> None:
    """Check every entry of a bundle, then add them to the cache (entries already there are kept); with
    --precompiled DIR, write the bundle's precompiled directory there and check it."""
    found = read_bundle(bundle, bundle_key())
    differ = check_toolchain(found, force)
    partly = unusable(found)
    if partly and not json:  # said before anything is copied: these entries will never be hit here
        render.warn(f"{partly}; the others are imported, but will never be used by this toolchain")
    if precompiled is not None:
        write_precompiled(precompiled, found.precompiled, bundle)
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
                                 "precompiled": sorted(found.precompiled) if precompiled is not None else [],
                                 "present": len(found.entries) - added, "manifests": len(found.manifests),
                                 "toolchain_differs": differ, "signature_checked": found.signed,
                                 **({"unusable": partly} if partly else {})})
    render.note("Imported {} ({} already there) and {} into {}.", render.plural(added, "entry"),
                len(found.entries) - added, render.plural(len(found.manifests), "manifest"), cache.path)
    if differ:
        render.note("[yellow]warning:[/yellow] forced past a toolchain mismatch: {}", "; ".join(differ))


def push(cache_dir: CacheDir = None, remote: Remote = None, model: Model = None, json: Json = False) -> None:
    """Copy this host's entries (or one model's) and their manifests to the fleet tier, e.g. from CI
    after hpurecipe warm."""
    from hpu_backend.shipping.fleet import push as push_to

    cache = open_cache(cache_dir, quiet=True, remote=remote, inspect=True)
    if cache is None:
        raise CliError("no recipe cache to push; fill it with: hpurecipe warm MODEL.py")
    done = push_to(cache, model)
    if json:
        return render.emit_json({"pushed": done.entries, "manifests": done.manifests, "remote": done.remote})
    render.note("Pushed {} and {} to {}.", render.plural(done.entries, "entry"),
                render.plural(done.manifests, "manifest"), done.remote)


def pull(model_file: ModelFile, cache_dir: CacheDir = None, remote: Remote = None, axis: Axis = None,
         train: Train = False, json: Json = False) -> None:
    """Fetch from the fleet tier just the entries this model file's buckets need, as listed by the manifest
    that push sent (without one, the buckets are compiled compile-only to learn their keys)."""
    from hpu_backend.shipping.fleet import pull as pull_from

    from .specs import load_spec

    spec = load_spec(model_file, axis)
    done = pull_from(open_cache(cache_dir, create=True, remote=remote), spec, train=train)
    if json:
        render.emit_json({"needed": done.needed, "pulled": done.pulled, "missing": done.missing,
                          "remote": done.remote})
    else:
        render.note("Pulled {} of the {} entries {} needs from {}; {} missing.", done.pulled, done.needed, spec.name,
                    done.remote, len(done.missing))
    if done.missing:
        raise typer.Exit(1)
