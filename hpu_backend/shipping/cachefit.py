"""Whether a cache holds what a warm-up built, and if not, why: entries trimmed to stay under the size limit
(the cache is too small: the size it needs, sized from the eviction log), entries removed on request by another
process (evict, remove, clear), entries a cache that cannot be written never stored, and entries gone without
a trace."""

from __future__ import annotations

import os
from pathlib import Path

from recipecache import RecipeCache
from recipecache.eviction import EVICTIONS_LOG, EvictionLog, Removal

from .reports import CacheFit, WarmReport

TRIMMED = "limit"  # the eviction log's reason for a removal that kept the cache under its limit


def cache_fit(report: WarmReport, cache: RecipeCache) -> CacheFit:
    """Which entries of ``report``'s points ``cache`` still holds, their total size, and why any went."""
    config = cache.config
    keys = {k for p in report.points for k in (*p.keys, *p.programs)}
    infos = cache.entries()
    held = {info.key: info.size for info in infos if info.key in keys}
    evicted = sorted(keys - set(held))
    logged = EvictionLog(Path(config.resolved_path()) / EVICTIONS_LOG).records() if evicted else {}
    known = [logged[k].size for k in evicted if k in logged]
    typical = (sum(held.values()) + sum(known)) / max(len(held) + len(known), 1)  # for a key the log lacks
    needed_bytes = sum(held.values()) + sum(logged[k].size if k in logged else typical for k in evicted)
    return CacheFit(config.limit_bytes, len(keys), int(needed_bytes), evicted,
                    trimmed=[k for k in evicted if k in logged and logged[k].reason == TRIMMED],
                    removed={k: _how(logged[k]) for k in evicted if k in logged and logged[k].reason != TRIMMED},
                    unstored=[k for k in evicted if k not in logged], disk_problem=cache.disk_problem,
                    other_bytes=sum(info.size for info in infos if info.key not in keys))


def _how(removal: Removal) -> str:
    """'clear by another process (pid 123)', 'evict by this process'."""
    who = "this process" if removal.pid == os.getpid() else f"another process (pid {removal.pid})"
    return f"{removal.reason} by {who}"
