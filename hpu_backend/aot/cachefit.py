"""Whether a cache holds what a warm-up built, and if not, why: entries trimmed to stay under the size limit
(the cache is too small: the size it needs, sized from the eviction log), entries removed on request by another
process (evict, remove, clear), entries a cache that cannot be written never stored, and entries gone without
a trace."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipecache import RecipeCache
from recipecache.eviction import EVICTIONS_LOG, EvictionLog, Removal

if TYPE_CHECKING:
    from .warm import WarmReport

MiB = 1 << 20
HEADROOM = 1.25  # the limit also covers manifests and bookkeeping, and trimming stops a little below it
TRIMMED = "limit"  # the eviction log's reason for a removal that kept the cache under its limit


@dataclass
class CacheFit:
    """The entries (recipes and programs) a warm-up's points use, whether the cache kept them, and why not."""

    limit_bytes: int | None  # the cache's limit (None: unbounded)
    needed: int  # entries the points use
    needed_bytes: int  # their total size
    evicted: list[str] = field(default_factory=list)  # the keys of those the cache no longer holds, for any reason
    trimmed: list[str] = field(default_factory=list)  # ... of those removed to stay under the limit
    removed: dict[str, str] = field(default_factory=dict)  # ... of those removed on request: key → how
    unstored: list[str] = field(default_factory=list)  # ... of those the eviction log does not list
    disk_problem: str | None = None  # why the cache could not be written, if it could not
    other_bytes: int = 0  # what the cache holds besides these entries (it shares the limit)

    @property
    def fits(self) -> bool:
        return not self.evicted

    @property
    def stored_nothing(self) -> bool:
        """The points use entries and the cache holds none of them."""
        return self.needed > 0 and len(self.evicted) == self.needed

    @property
    def suggested_mb(self) -> float:
        """A limit (MiB, two significant digits, rounded up) that holds them and what else the cache holds,
        with room to spare; when entries were trimmed, always above the current limit."""
        mb = round_up((self.needed_bytes + self.other_bytes) * HEADROOM / MiB)
        if self.trimmed and self.limit_bytes:
            mb = max(mb, round_up(self.limit_bytes * HEADROOM / MiB))
        return mb

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "suggested_mb": self.suggested_mb}


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


def round_up(mb: float) -> float:
    """``mb`` rounded up to two significant digits (0.0613 → 0.062, 268.5 → 270)."""
    if mb <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(mb)) - 1)
    return round(math.ceil(mb / step - 1e-9) * step, 12)
