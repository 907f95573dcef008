"""Whether a cache holds what a warm-up built: the entries its points use that are still there, and the
size the cache needs to hold them all (entries evicted during the run are sized from the eviction log)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipecache import RecipeCache
from recipecache.eviction import EVICTIONS_LOG, EvictionLog

if TYPE_CHECKING:
    from .warm import WarmReport

MiB = 1 << 20
HEADROOM = 1.25  # the limit also covers manifests and bookkeeping, and trimming stops a little below it


@dataclass
class CacheFit:
    """The entries (recipes and programs) a warm-up's points use, and whether the cache kept them."""

    limit_bytes: int | None  # the cache's limit (None: unbounded)
    needed: int  # entries the points use
    needed_bytes: int  # their total size
    evicted: list[str] = field(default_factory=list)  # the keys of those the cache no longer holds

    @property
    def fits(self) -> bool:
        return not self.evicted

    @property
    def suggested_mb(self) -> float:
        """A limit (MiB, two significant digits, rounded up) that holds them with room to spare."""
        return round_up(self.needed_bytes * HEADROOM / MiB)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "suggested_mb": self.suggested_mb}


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


def round_up(mb: float) -> float:
    """``mb`` rounded up to two significant digits (0.0613 → 0.062, 268.5 → 270)."""
    if mb <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(mb)) - 1)
    return round(math.ceil(mb / step - 1e-9) * step, 12)
