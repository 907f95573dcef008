"""Commands that ship a cache between machines: export and import bundles; push to and pull from the
fleet tier (Redis)."""

from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Annotated

import typer

from hpu_backend.aot.bundles import bundle_key, check_toolchain, read_bundle, write_bundle
from hpu_backend.aot.manifests import manifest_name, read_manifests, write_manifest

from . import render
from .caches import open_cache, recipe_problem, require_remote
from .errors import CliError
from .options import Axis, CacheDir, Json, Model, ModelFile, Remote, Train

BundlePath = Annotated[Path, typer.Argument(help="The bundle file (a tar).", show_default=False)]


def export(bundle: BundlePath, cache_dir: CacheDir = None, model: Model = None, json: Json = False) -> None:
    """Write the cache's entries (or one model's) with their manifests and the toolchain into one file."""
    cache = open_cache(cache_dir, quiet=True, inspect=True)
    if cache is None:
        raise CliError("no recipe cache to export; fill it with: hpurecipe warm MODEL.py")
    keys = [i.key for i in cache.entries() if model is None or i.meta.get("model") == model]
    if not keys:
        raise CliError(f"no entries{f' for model {model}' if model else ''} to export")
    manifests = {manifest_name(d["model"], d["mode"]): d for d in read_manifests(cache.path)
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


def push(cache_dir: CacheDir = None, remote: Remote = None, model: Model = None, json: Json = False) -> None:
    """Copy this host's entries (or one model's) and their manifests to the fleet tier, e.g. from CI
    after hpurecipe warm."""
    cache = open_cache(cache_dir, quiet=True, remote=remote, inspect=True)
    if cache is None:
        raise CliError("no recipe cache to push; fill it with: hpurecipe warm MODEL.py")
    require_remote(cache)
    keys = None if model is None else [i.key for i in cache.entries() if i.meta.get("model") == model]
    manifests = [d for d in read_manifests(cache.path) if model is None or d["model"] == model]
    try:
        sent = cache.push(keys)
        for doc in manifests:
            if not _put_manifest(cache.remote, doc):
                raise ConnectionError(f"remote cache {cache.remote.url} is unavailable")
    except ConnectionError as e:
        raise CliError(f"{e}; nothing more was pushed") from None
    if json:
        return render.emit_json({"pushed": sent, "manifests": len(manifests), "remote": cache.remote.url})
    render.note("Pushed {} and {} to {}.", render.plural(sent, "entry"), render.plural(len(manifests), "manifest"),
                cache.remote.url)


def pull(model_file: ModelFile, cache_dir: CacheDir = None, remote: Remote = None, axis: Axis = None,
         train: Train = False, json: Json = False) -> None:
    """Fetch from the fleet tier just the entries this model file's buckets need, as listed by the manifest
    that push sent (without one, the buckets are compiled compile-only to learn their keys)."""
    from .specs import load_spec

    spec = load_spec(model_file, axis)
    cache = open_cache(cache_dir, create=True, remote=remote)
    require_remote(cache)
    keys = _keys_from_manifest(cache, spec, train)
    if keys is None:
        from hpu_backend.aot.warm import plan

        keys = sorted({k for p in plan(spec, train=train) for k in p.keys + p.programs})
    got = cache.pull(keys, check=recipe_problem)
    missing = [k for k in keys if not cache.contains(k)]
    if json:
        render.emit_json({"needed": len(keys), "pulled": got, "missing": missing, "remote": cache.remote.url})
    else:
        render.note("Pulled {} of the {} entries {} needs from {}; {} missing.", got, len(keys), spec.name,
                    cache.remote.url, len(missing))
    if missing:
        raise typer.Exit(1)


def push_manifest(config, doc: dict) -> None:
    """Send a manifest to the configured fleet tier, through the tier the run used: if the tier failed, it
    has said so once already, and says nothing more."""
    from hpu_backend.formats.keyparts import toolchain_id
    from hpu_backend.serve.store import store_for
    from recipecache.remote import RemoteTier

    disk = store_for(config).disk
    remote = disk.remote if disk is not None and disk.remote is not None else RemoteTier(
        config.remote, config.remote_ttl_s, toolchain_id())
    _put_manifest(remote, doc)


def _keys_from_manifest(cache, spec, train: bool) -> list[str] | None:
    """The keys the pushed manifest lists for the spec's points, or None if it lacks one of them."""
    from hpu_backend.formats.keyparts import toolchain
    from hpu_backend.aot.modelfile import point_label
    from recipecache.entry import KEY_RE

    data = cache.remote.get_doc(manifest_name(spec.name, "train" if train else "inference"))
    try:
        doc = _json.loads(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("toolchain") != toolchain() or not isinstance(doc.get("buckets"), dict):
        return None
    lists = [doc["buckets"].get(point_label(p)) for p in spec.points()]
    if any(not isinstance(k, list) or not all(isinstance(x, str) and KEY_RE.fullmatch(x) for x in k) for k in lists):
        return None
    return sorted({k for keys in lists for k in keys})


def _put_manifest(remote, doc: dict) -> bool:
    """Send one manifest to the fleet tier under its file name; False if the tier is unavailable."""
    return remote.put_doc(manifest_name(doc["model"], doc["mode"]), _json.dumps(doc).encode())
