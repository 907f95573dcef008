"""Whether a cache holds what a warm-up built: the entries its points use that are still there, and the
size the cache needs to hold them all (entries evicted during the run are sized from the eviction log)."""

from __future__ import annotations

from pathlib import Path

from recipecache import RecipeCache
from recipecache.eviction import EVICTIONS_LOG, EvictionLog

from .reports import CacheFit, WarmReport


def cache_fit(report: WarmReport, cache: RecipeCache) -> CacheFit:
    """Which entries of ``report``'s points ``cache`` still holds, and their total size."""
    config = cache.config
    keys = {k for p in report.points for k in (*p.keys, *p.programs)}
    held = {info.key: info.size for info in cache.entries() if info.key in keys}
    evicted = sorted(keys - set(held))
    logged = EvictionLog(Path(config.resolved_path()) / EVICTIONS_LOG).sizes() if evicted else {}
    known = [logged[k] for k in evicted if k in logged]
    typical = (sum(held.values()) + sum(known)) / max(len(held) + len(known), 1)  # for a key the log lacks
    needed_bytes = sum(held.values()) + sum(logged.get(k, typical) for k in evicted)
    return CacheFit(config.limit_bytes, len(keys), int(needed_bytes), evicted)
