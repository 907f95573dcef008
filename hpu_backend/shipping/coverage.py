"""Coverage: which shape points of a model file have every entry they use (recipes and programs) in a cache,
from a compile-only plan that reads no cache; and, when entries are missing because the cache evicted them for
space, that the cache is too small rather than unwarmed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from recipecache import RecipeCache

from .cachefit import cache_fit
from .cachepolicy import recipe_problem
from ..modelfiles.modelspec import ModelSpec
from .reports import CacheFit, PointResult, WarmReport
from .warm import plan


@dataclass
class Coverage:
    """Per point, the entries the cache lacks; ``fit`` says whether lack of space is why."""

    model: str
    points: list[dict[str, Any]]  # {"bucket", "recipes", "missing": [keys]}
    fit: CacheFit | None = None  # set when missing entries were evicted for space (the cache is too small)

    @property
    def uncovered(self) -> list[str]:
        return [p["bucket"] for p in self.points if p["missing"]]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "buckets": len(self.points), "covered": len(self.points) - len(self.uncovered),
                "uncovered": self.uncovered, "points": self.points,
                **({"cache_fit": self.fit.to_dict()} if self.fit else {})}


def coverage(spec: ModelSpec, cache: RecipeCache | None, *, train: bool = False,
             on_point: Callable[[PointResult], None] | None = None) -> Coverage:
    """Plan ``spec``'s points (compile-only, no cache) and look their entries up in ``cache`` (None: empty)."""
    points = plan(spec, train=train, on_point=on_point)
    rows = [{"bucket": p.label, "recipes": len(p.keys),
             "missing": [k for k in p.keys + p.programs if not _usable(cache, k)]} for p in points]
    result = Coverage(spec.name, rows)
    if cache is not None and result.uncovered:
        result.fit = _evicted_for_space(WarmReport(spec.name, "", points, 0.0), cache)
    return result


def _usable(cache: RecipeCache | None, key: str) -> bool:
    """Whether the cache holds an intact entry under key that serving can use (a damaged or malformed one
    counts as missing: serving would quarantine it)."""
    entry = cache.peek(key) if cache is not None else None
    return entry is not None and recipe_problem(entry.payload) is None


def _evicted_for_space(report: WarmReport, cache: RecipeCache) -> CacheFit | None:
    """The cache's fit when some missing entry was trimmed to keep the cache under its limit (not merely never
    built, nor removed on request); else None (warming again is the fix)."""
    fit = cache_fit(report, cache)
    return fit if fit.trimmed else None
