"""The fleet tier (Redis) seen from a model file: push a cache's entries and manifests, pull just the entries a
model file's points need (listed by the pushed manifest, else learned by a compile-only plan), and send a
warm-up's manifest. An unreachable server is a FleetUnreachable, never "N entries missing"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recipecache import CacheConfig, CacheError, RecipeCache
from recipecache.entry import KEY_RE
from recipecache.remote import RemoteTier

from ..formats.keyparts import toolchain, toolchain_id
from .cachepolicy import recipe_problem
from .manifests import manifest_name, put_manifest, read_manifests
from ..modelfiles.modelspec import ModelSpec, point_label


class FleetUnreachable(CacheError):
    """The fleet tier's server did not answer (one line naming it)."""


@dataclass
class Pushed:
    entries: int
    manifests: int
    remote: str


@dataclass
class Pulled:
    needed: int
    pulled: int
    missing: list[str] = field(default_factory=list)
    remote: str = ""
    from_manifest: bool = True  # the keys came from the pushed manifest (else from a compile-only plan)


def push(cache: RecipeCache, model: str | None = None) -> Pushed:
    """Copy the cache's entries (or one model's) and their manifests to its fleet tier."""
    remote = _tier(cache)
    keys = None if model is None else [i.key for i in cache.entries() if i.meta.get("model") == model]
    manifests = [d for d in read_manifests(cache.path) if model is None or d["model"] == model]
    try:
        sent = cache.push(keys)
    except ConnectionError:
        raise FleetUnreachable(f"remote cache {remote.url}: server unreachable; not every entry was pushed") from None
    for doc in manifests:
        if not put_manifest(remote, doc):
            raise FleetUnreachable(f"remote cache {remote.url}: server unreachable; the manifests were not pushed")
    return Pushed(sent, len(manifests), remote.url)


def pull(cache: RecipeCache, spec: ModelSpec, *, train: bool = False) -> Pulled:
    """Fetch the entries ``spec``'s points need that the cache lacks; FleetUnreachable if the server is down."""
    remote = _tier(cache)
    keys = keys_from_manifest(remote, spec, train)
    _reachable(remote, "nothing was pulled")
    from_manifest = keys is not None
    if keys is None:
        from .warm import plan

        keys = sorted({k for p in plan(spec, train=train) for k in p.keys + p.programs})
    got = cache.pull(keys, check=recipe_problem)  # an entry serving could not use is not pulled (and deleted there)
    _reachable(remote, f"{got} of the {len(keys)} entries needed were pulled")
    return Pulled(len(keys), got, [k for k in keys if not cache.contains(k)], remote.url, from_manifest)


def remote_stats(cache: RecipeCache) -> dict[str, Any]:
    """Entries and bytes in the cache's fleet tier; FleetUnreachable if the server is down."""
    return _stats_of(_tier(cache))


def fleet_stats(config: CacheConfig) -> dict[str, Any]:
    """Entries and bytes in the fleet tier ``config`` names, for a host with no local cache yet (the tier a new
    serving host would pull from); FleetUnreachable if the server is down."""
    return _stats_of(RemoteTier(config.remote, config.remote_ttl_s, toolchain_id()))


def _stats_of(remote: RemoteTier) -> dict[str, Any]:
    try:
        return {"url": remote.url, **remote.stats()}
    except ConnectionError:
        raise FleetUnreachable(f"remote cache {remote.url}: server unreachable") from None


def keys_from_manifest(remote: RemoteTier, spec: ModelSpec, train: bool) -> list[str] | None:
    """The keys the pushed manifest lists for the spec's points, or None if it lacks one of them."""
    data = remote.get_doc(manifest_name(spec.name, "train" if train else "inference"))
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("toolchain") != toolchain() or not isinstance(doc.get("buckets"), dict):
        return None
    lists = [doc["buckets"].get(point_label(p)) for p in spec.points()]
    if any(not isinstance(k, list) or not all(isinstance(x, str) and KEY_RE.fullmatch(x) for x in k) for k in lists):
        return None
    return sorted({k for keys in lists for k in keys})


def _tier(cache: RecipeCache) -> RemoteTier:
    if cache.remote is None:
        raise CacheError("no remote cache configured: set HPU_RECIPE_CACHE_REMOTE=redis://host:port/db or pass "
                         "--remote")
    return cache.remote


def _reachable(remote: RemoteTier, done: str) -> None:
    """FleetUnreachable if the last call to the tier failed (it backs off after a failure)."""
    if not remote.available:
        raise FleetUnreachable(f"remote cache {remote.url}: server unreachable; {done}")
