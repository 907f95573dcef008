"""Commands that inspect and maintain a cache directory: ls, show, stats, evict, verify, clear, explain."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from hpu_backend.formats.program import parse_payload
from hpu_backend.formats.recipe import RecipeFormatError
from hpu_backend.formats.keyparts import entry_kind, explain as explain_keys, miss_reasons, nearest
from hpu_backend.shipping.cachepolicy import recipe_problem
from recipecache import EntryInfo, RecipeCache

from . import packagecmds, precompilecmds, render
from .precompilecmds import is_precompiled
from .caches import config_for, open_cache, resolve_key
from .errors import CliError
from .options import CacheDir, DryRun, Json, Key, Model, Remote, Yes
from .packagecmds import PackageFile
from .units import parse_age, parse_size


class SortBy(str, Enum):
    size = "size"
    created = "created"
    used = "used"
    hits = "hits"


_SORT_KEYS = {"size": lambda i: i.size, "created": lambda i: i.created, "used": lambda i: i.last_used,
              "hits": lambda i: i.hits}


def _row(info: EntryInfo) -> dict:
    m = info.meta
    return {"key": info.key, "graph": m.get("graph", ""), "kind": m.get("kind", ""), "model": m.get("model", ""),
            "bucket": m.get("bucket", {}), "size": info.size, "created": info.created,
            "last_used": info.last_used, "hits": info.hits}


def _bucket(info: EntryInfo) -> str:
    """A recipe's bucket; '-' for a program (one per Dynamo graph, covering all its buckets)."""
    return "-" if info.meta.get("kind") == "program" else render.bucket(info.meta.get("bucket"))


def ls(package: PackageFile = None, cache_dir: CacheDir = None,
       sort: Annotated[SortBy, typer.Option(help="Sort order (largest/newest first).")] = SortBy.used,
       model: Model = None, json: Json = False) -> None:
    """List cache entries: key, graph, model, bucket, size, created, last used, hits (or a package's buckets)."""
    if package is not None:
        return precompilecmds.ls(package, json) if is_precompiled(package) else packagecmds.ls(package, json)
    cache = open_cache(cache_dir, quiet=json, inspect=True)
    infos = [] if cache is None else [i for i in cache.entries() if model is None or i.meta.get("model") == model]
    infos.sort(key=_SORT_KEYS[sort.value], reverse=True)
    if json:
        return render.emit_json([_row(i) for i in infos])
    if cache is None:
        return
    if not infos:
        return render.note("No entries{} in the recipe cache at {}.", f" for model {model}" if model else "",
                           cache.path)
    now = time.time()
    render.table(["key", "kind", "graph", "model", "bucket", "size", "created", "last used", "hits"],
                 ([i.key[:12], i.meta.get("kind", "") or "-", i.meta.get("graph", ""), i.meta.get("model", "") or "-",
                   _bucket(i), render.size(i.size), render.ago(i.created, now),
                   render.ago(i.last_used, now), i.hits] for i in infos), right=("size", "hits"))
    render.note("{} entries, {} in {}", len(infos), render.size(sum(i.size for i in infos)), cache.path)


def show(key: Key, cache_dir: CacheDir = None, json: Json = False) -> None:
    """Show one recipe in full: inputs/outputs, placement and fallbacks, clusters, fusions, memory, cost, guards.
    Given a package file, show the package: toolchain, inputs, ranges and buckets."""
    from .recipeview import describe, print_description

    if is_precompiled(key):
        return precompilecmds.show(Path(key), json)
    if packagecmds.is_package(key):
        return packagecmds.show(Path(key), json)

    cache = _existing(cache_dir, inspect=True)
    infos = cache.entries()
    full = resolve_key(cache, key, infos)
    entry = cache.peek(full)
    if entry is None:
        raise CliError(f"entry {full} is unreadable; run: hpurecipe verify --fix")
    try:
        recipe = parse_payload(entry.payload)
    except RecipeFormatError as e:
        raise CliError(f"entry {full} is not a recipe of this format: {e}") from None
    doc = describe(entry, recipe, next(i.size for i in infos if i.key == full))
    render.emit_json(doc) if json else print_description(doc)


def stats(cache_dir: CacheDir = None, zero: Annotated[bool, typer.Option(
          "--zero", "-z", help="Zero the counters after printing them.")] = False,
          remote: Remote = None, json: Json = False) -> None:
    """Size and limit, entries, hits, misses, evictions, corrupt entries, compile time saved; with a fleet tier
    (--remote URL or HPU_RECIPE_CACHE_REMOTE), also its entries and bytes."""
    from hpu_backend.shipping.fleet import FleetUnreachable, remote_stats

    config = config_for(cache_dir, remote)
    cache = open_cache(cache_dir, quiet=json or bool(config.remote), remote=remote, inspect=True)
    if cache is None:
        return _fleet_only(config, json)
    doc, unreachable = cache.stats(), None
    if cache.remote is not None:
        try:
            doc["remote"] = remote_stats(cache)
        except FleetUnreachable as e:
            doc["remote"], unreachable = {"url": cache.remote.url, "error": "server unreachable"}, e
    if zero:
        cache.reset_stats()
    render.emit_json(doc) if json else _print_stats(doc, zero)
    if unreachable is not None:
        raise CliError(str(unreachable))


def _fleet_only(config, json: bool) -> None:
    """No local cache: the fleet tier's counts when one is configured (FleetUnreachable, exit 1, if it is down)."""
    from hpu_backend.shipping.fleet import fleet_stats

    doc = {"path": str(config.resolved_path()), "entries": 0, "total_bytes": 0}
    if config.remote:
        doc["remote"] = fleet_stats(config)
    if json:
        return render.emit_json(doc)
    if config.remote:
        fleet = doc["remote"]
        render.pairs({"path": f"{doc['path']} (no local cache yet)",
                      "fleet tier": f"{fleet['entries']} entries, {render.size(fleet['bytes'])} at {fleet['url']}"})


def _print_stats(doc: dict, zero: bool) -> None:
    limit = "unbounded" if doc["limit_bytes"] < 0 else render.size(doc["limit_bytes"])
    lookups = doc["hits"] + doc["misses"]
    fleet = doc.get("remote")
    render.pairs({
        "path": doc["path"], "size": f"{render.size(doc['total_bytes'])} in entries + "
                                     f"{render.size(doc['metadata_bytes'])} other files, of {limit}",
        "entries": doc["entries"],
        "hits": f"{doc['hits']} ({doc['disk_hits']} from disk)"
                + (f", {100 * doc['hits'] / lookups:.0f}% of lookups" if lookups else ""),
        "misses": doc["misses"], "evictions": f"{doc['evictions']} ({render.size(doc['bytes_evicted'])})",
        "corrupt": doc["corrupt"], "written": render.size(doc["bytes_written"]),
        "compile time saved": render.duration(doc["compile_time_saved_s"]),
        **({"fleet tier": f"{fleet['url']}: server unreachable" if "error" in fleet else
            f"{fleet['entries']} entries, {render.size(fleet['bytes'])} at {fleet['url']}; "
            f"{doc['remote_hits']} hits from it"} if fleet else {})})
    if zero:
        render.note("Counters zeroed.")


def evict(cache_dir: CacheDir = None,
          older_than: Annotated[Optional[str], typer.Option(help="Not used for this long: 30m, 12h, 7d.")] = None,
          max_size: Annotated[Optional[str], typer.Option(help="Evict until the cache fits: 500MB, 2GB.")] = None,
          model: Model = None,
          key: Annotated[Optional[list[str]], typer.Option(help="This entry (a key or unique prefix; repeatable).")]
          = None, dry_run: DryRun = False, yes: Yes = False, json: Json = False) -> None:
    """Evict entries matching every filter given (none: trim to the size limit). Plans, prints, asks, then evicts."""
    older_than_s = parse_age(older_than) if older_than else None  # a bad value is refused before anything is read
    max_bytes = parse_size(max_size) if max_size else None
    cache = _existing(cache_dir)
    keys = [resolve_key(cache, k) for k in key] if key else None
    predicate = (lambda i: i.meta.get("model") == model) if model is not None else None
    plan = cache.evict(older_than_s=older_than_s, max_bytes=max_bytes, keys=keys, predicate=predicate, dry_run=True)
    _print_plan(plan, "evict", json)
    if plan and not dry_run and _confirm(f"Evict {render.plural(len(plan), 'entry')}?", yes):
        done = cache.evict(keys=[i.key for i in plan])
        _done(f"Evicted {render.plural(len(done), 'entry')} ({render.size(sum(i.size for i in done))}).", json)


def clear(cache_dir: CacheDir = None, dry_run: DryRun = False, yes: Yes = False, json: Json = False) -> None:
    """Remove every entry (the counters are kept)."""
    cache = _existing(cache_dir)
    plan = cache.entries()
    _print_plan(plan, "remove", json)
    if plan and not dry_run and _confirm(f"Remove all {len(plan)} entries from {cache.path}?", yes):
        cache.clear()
        _done(f"Removed {render.plural(len(plan), 'entry')}.", json)


def verify(package: PackageFile = None, cache_dir: CacheDir = None, fix: Annotated[bool, typer.Option(
           "--fix", help="Move bad entry files (damaged, or not a recipe) to the quarantine folder.")] = False,
           json: Json = False) -> None:
    """Check every entry's format and checksum, and that its payload is a recipe. Exit 1 if any is bad.
    Given a package file, check it and load every recipe in it."""
    if package is not None:
        return precompilecmds.verify(package, json) if is_precompiled(package) else packagecmds.verify(package, json)
    cache = open_cache(cache_dir, quiet=json, inspect=not fix)
    if cache is None:
        return render.emit_json({"entries": 0, "bad": 0, "problems": []}) if json else None
    on_disk = set(cache.keys())
    bad = [{"entry": name, "reason": reason} for name, reason in cache.verify(fix=fix, check=recipe_problem)]
    count = len(on_disk | {b["entry"] for b in bad})
    if json:
        render.emit_json({"entries": count, "bad": len(bad), "fixed": fix, "problems": bad})
    elif not bad:
        render.note("All {} entries are valid recipes.", count)
    else:
        render.table(["entry", "problem"], ([b["entry"], b["reason"]] for b in bad))
        render.note(("Fixed: quarantined {} entries." if fix else
                     "{} bad entries; run: hpurecipe verify --fix"), len(bad))
    if bad and not fix:
        raise typer.Exit(1)


def explain(key_a: Key, key_b: Annotated[Optional[str], typer.Argument(
                help="The entry to compare with (without it: --miss).", show_default=False)] = None,
            miss: Annotated[bool, typer.Option("--miss", help="Why KEY_A's graph missed the entry the cache holds "
                                               "for it under another key: what differs, old → new.")] = False,
            cache_dir: CacheDir = None, json: Json = False) -> None:
    """Why two recipes have different keys: the key parts that differ, with readable values where recorded.
    With --miss and one key: why that entry's lookup missed the same graph's nearest entry under another key."""
    cache = _existing(cache_dir, inspect=True)
    infos = cache.entries()
    if miss or key_b is None:
        if key_b is not None:
            raise CliError("explain --miss takes one key: the entry whose lookup missed")
        return _explain_miss(cache, resolve_key(cache, key_a, infos), infos, json)
    a, b = resolve_key(cache, key_a, infos), resolve_key(cache, key_b, infos)
    entries = _peek(cache, a, b)
    rows = explain_keys(entries[0].meta, entries[1].meta)
    if json:
        return render.emit_json({"a": a, "b": b, "differ": rows})
    if not rows:
        return render.note("{} and {} have the same key parts.", a[:12], b[:12])
    render.table(["part", a[:12], b[:12]], ([r["part"], render.bucket(r["a"]) if r["part"] == "bucket" else r["a"],
                                              render.bucket(r["b"]) if r["part"] == "bucket" else r["b"]]
                                             for r in rows))


def _peek(cache: RecipeCache, *keys: str) -> list:
    entries = [cache.peek(k) for k in keys]  # inspection, not use: no hit counted
    if None in entries:
        raise CliError(f"entry {keys[entries.index(None)]} vanished or is unreadable; run: hpurecipe verify")
    return entries


def _explain_miss(cache: RecipeCache, key: str, infos: list[EntryInfo], json: bool) -> None:
    """The same graph's nearest other entry, and what differs from it, old → new."""
    new = _peek(cache, key)[0].meta
    kind, parts = entry_kind(new), new.get("key_parts", {})
    old = nearest([i.meta for i in infos if i.key != key], kind, parts)
    old_key = next((i.key for i in infos if old is not None and i.meta is old), None)
    reasons = [] if old is None else miss_reasons(old, parts, new.get("key_detail", {}))
    if json:
        return render.emit_json({"key": key, "kind": kind, "nearest": old_key, "differ": reasons})
    if old is None:
        return render.note("The cache holds no other entry for the graph of {} ({}): nothing to explain.",
                           key[:12], kind)
    render.note("{} ({}) misses {}, the same graph under another key: {}", key[:12], kind, old_key[:12],
                "; ".join(reasons))


def _existing(cache_dir, inspect: bool = False) -> RecipeCache:
    cache = open_cache(cache_dir, quiet=True, inspect=inspect)
    if cache is None:
        raise CliError(f"no recipe cache at {config_for(cache_dir).resolved_path()}; "
                       "fill it with: hpurecipe warm MODEL.py")
    return cache


def _print_plan(plan: list[EntryInfo], verb: str, json: bool) -> None:
    if json:
        return render.emit_json({"plan": [_row(i) for i in plan], "bytes": sum(i.size for i in plan)})
    if not plan:
        return render.note("Nothing to {}.", verb)
    now = time.time()
    render.table(["key", "kind", "graph", "model", "bucket", "size", "last used"],
                 ([i.key[:12], i.meta.get("kind", "") or "-", i.meta.get("graph", ""), i.meta.get("model", "") or "-",
                   _bucket(i), render.size(i.size), render.ago(i.last_used, now)]
                  for i in plan),
                 title=f"Would {verb} {render.plural(len(plan), 'entry')} ({render.size(sum(i.size for i in plan))}):",
                 right=("size",))


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not typer.confirm(question, default=False):
        render.note("Nothing changed.")
        return False
    return True


def _done(message: str, json: bool) -> None:
    if not json:
        render.note(message)
