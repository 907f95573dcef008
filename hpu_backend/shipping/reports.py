"""What a warm-up reports: the recipes each shape point used, the points, and whether the cache kept them.

The report types live apart from their drivers (``warm.py`` makes them; ``cachefit.py``, ``manifests.py``,
``coverage.py`` and the CLI read them), so that producer and readers import them without a circle.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..modelfiles.modelspec import point_label

MiB = 1 << 20
HEADROOM = 1.25  # the limit also covers manifests and bookkeeping, and trimming stops a little below it


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


@dataclass(frozen=True)
class UsedRecipe:
    """A recipe a point ran or took up, as its graph's events reported it."""

    graph: str  # the compiled graph's name (fx_graph_0003_fw): the same graph at two points has one name
    recipe: Any  # the Recipe
    key: str | None  # its cache key (None: not cached)
    env: dict[str, int]  # the call's symbol values ({} when it was only taken up)
    compiled_for: str  # why it was lowered ("new graph", "guard failure", "new bucket"); "" from the store


@dataclass
class PointResult:
    """What warming one shape point did."""

    point: dict[str, int]
    keys: list[str] = field(default_factory=list)  # the recipe keys this point uses
    compiled: int = 0  # recipes built (lowered) for this point
    hits: int = 0  # recipes this point used without building them (from the cache: disk or memory)
    seconds: float = 0.0
    max_abs_diff: float | None = None  # vs eager, with check=True
    check_error: str = ""
    programs: list[str] = field(default_factory=list)  # the keys of the programs (Dynamo graphs) it uses
    fallback_ops: list[str] = field(default_factory=list)  # ops its recipes run on the CPU (placement fallbacks)
    missed: list[str] = field(default_factory=list)  # misses of entries the cache holds under another key: why
    rank: int | None = None  # the rank it was built as (warm over several cards), else None
    used: list[UsedRecipe] = field(default_factory=list, repr=False)  # live recipes, for analysis; not in JSON

    @property
    def label(self) -> str:
        return point_label(self.point)

    @property
    def status(self) -> str:
        return "compiled" if self.compiled else "hit"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what ``--json`` prints and prebuild's workers send back): without ``used``, and without
        ``rank`` on one card."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "used" and not (f.name == "rank" and self.rank is None)}


@dataclass
class WarmReport:
    """All points of one warm-up, with the totals ``--json`` prints."""

    model: str
    mode: str  # "inference" | "train"
    points: list[PointResult]
    seconds: float
    fit: CacheFit | None = None  # whether the cache kept what the points use (warm and prebuild)
    manifest: str | None = None  # the manifest warm and prebuild wrote (None: it could not be written)
    warnings: list[str] = field(default_factory=list)  # what went wrong around the run (the run itself is fine)
    cards: int = 1  # the ranks built (a tensor-parallel deployment over that many cards), each point naming its rank

    def summary(self) -> dict[str, Any]:
        keys = {k for p in self.points for k in p.keys}
        return {"model": self.model, "mode": self.mode, "buckets": len(self.points),
                "compiled": sum(p.compiled for p in self.points), "hits": sum(p.hits for p in self.points),
                "recipes": len(keys), "seconds": round(self.seconds, 3),
                "mismatches": sum(bool(p.check_error) for p in self.points),
                "fallback_ops": sorted({op for p in self.points for op in p.fallback_ops}),
                **({"missed": missed} if (missed := sorted({m for p in self.points for m in p.missed})) else {}),
                **({"cards": self.cards, "ranks": self.ranks()} if self.cards > 1 else {})}

    def ranks(self) -> list[dict[str, Any]]:
        """Per rank: what it compiled and reused, its distinct recipes, and ``same_as``, the first rank whose
        recipes are exactly its own (itself when none before it has them)."""
        keys: dict[int, frozenset[str]] = {}
        for p in self.points:
            keys[p.rank] = keys.get(p.rank, frozenset()) | set(p.keys)
        rows = []
        for rank, own in keys.items():
            points = [p for p in self.points if p.rank == rank]
            rows.append({"rank": rank, "compiled": sum(p.compiled for p in points), "hits": sum(p.hits for p in points),
                         "recipes": len(own), "same_as": next(r for r, k in keys.items() if k == own)})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "points": [p.to_dict() for p in self.points],
                **({"cache_fit": self.fit.to_dict()} if self.fit else {})}


def round_up(mb: float) -> float:
    """``mb`` rounded up to two significant digits (0.0613 → 0.062, 268.5 → 270)."""
    if mb <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(mb)) - 1)
    return round(math.ceil(mb / step - 1e-9) * step, 12)
