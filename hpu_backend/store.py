"""The backend's recipe store: recipes by key in this process, in front of the disk cache (recipecache).

The disk tier never fails a compile: a disk that cannot be opened (insecure, unwritable) means
"compile without caching" after one warning; an entry that does not parse as a recipe is a miss.
A malformed cache configuration is an error, because it is a user's typo, not a machine's state.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from recipecache import CacheConfig, CacheError, ConfigError, RecipeCache

from .keys import explain as differing
from .recipe import Recipe, RecipeFormatError
from .settings import Settings, SettingsError

log = logging.getLogger(__name__)


class RecipeStore:
    """Recipes by key in this process; ``disk`` (a RecipeCache, or None) behind it."""

    def __init__(self, disk: RecipeCache | None = None):
        self.disk = disk
        self.recipes: dict[str, Recipe] = {}
        self.lock = threading.Lock()

    def get(self, key: str) -> Recipe | None:
        recipe = self.recipes.get(key)
        if recipe is None and self.disk is not None:
            recipe = self._load(key)
        return recipe

    def _load(self, key: str) -> Recipe | None:
        data = self.disk.get(key)
        if data is None:
            return None
        try:
            recipe = Recipe.from_bytes(data)
        except RecipeFormatError as e:
            log.warning("hpu_backend: cache entry %s is not a usable recipe (%s); compiling instead", key, e)
            return None
        with self.lock:
            self.recipes[key] = recipe
        return recipe

    def put(self, key: str, recipe: Recipe, parts: dict[str, str], detail: dict[str, Any],
            settings: Settings) -> None:
        with self.lock:
            self.recipes[key] = recipe
        if self.disk is not None:
            self.disk.put(key, recipe.to_bytes(), entry_meta(recipe, parts, detail, settings))


def entry_meta(recipe: Recipe, parts: dict[str, str], detail: dict[str, Any], settings: Settings) -> dict:
    """What a cache entry says about itself (for ls, show, explain and stats)."""
    return {
        "graph": recipe.name, "kind": recipe.kind, "model": settings.model, "target": recipe.target,
        "bucket": {s: list(r) for s, r in recipe.bucket.items()},
        "compile_time_s": float(recipe.facts.get("compile_time_s", 0.0)),
        "key_parts": dict(parts),
        "key_detail": {k: detail[k] for k in ("settings", "toolchain", "bucket") if k in detail},
    }


_stores: dict[Any, RecipeStore] = {}
_stores_lock = threading.Lock()


def cache_config(settings: Settings) -> CacheConfig:
    """The disk cache configuration: the ``cache_config`` option, else PT_HPU_RECIPE_CACHE_CONFIG."""
    try:
        if settings.cache_config:
            return CacheConfig.parse(settings.cache_config)
        return CacheConfig.from_env()
    except ConfigError as e:
        raise SettingsError(str(e)) from None


def store_for(settings: Settings) -> RecipeStore:
    """The process-wide store for these settings' cache configuration (opened once)."""
    config = cache_config(settings) if settings.cache else None
    ident = None if config is None else (str(config.resolved_path()), config.max_size_mb, config.policy)
    with _stores_lock:
        if ident not in _stores:
            _stores[ident] = RecipeStore(_open_disk(config))
        return _stores[ident]


def _open_disk(config: CacheConfig | None) -> RecipeCache | None:
    if config is None:
        return None
    try:
        cache = RecipeCache(config)
    except CacheError as e:
        log.warning("hpu_backend: recipe disk cache off, compiling without it: %s", e)
        return None
    return cache if cache.enabled else None


def explain(key_a: str, key_b: str, disk: RecipeCache) -> list[dict[str, Any]]:
    """Why two cached recipes have different keys: one row per differing key part.

    Each row is ``{"part", "a", "b"}`` with the readable values where the entry recorded them
    (settings, toolchain, bucket) and the part hashes otherwise. KeyError if an entry is missing.
    """
    metas = []
    for key in (key_a, key_b):
        entry = disk.get_entry(key)
        if entry is None:
            raise KeyError(key)
        metas.append(entry.meta)
    a, b = metas
    rows = []
    for part in differing(a.get("key_parts", {}), b.get("key_parts", {})):
        da, db = a.get("key_detail", {}).get(part), b.get("key_detail", {}).get(part)
        rows.append({"part": part,
                     "a": da if da is not None else a.get("key_parts", {}).get(part),
                     "b": db if db is not None else b.get("key_parts", {}).get(part)})
    return rows
