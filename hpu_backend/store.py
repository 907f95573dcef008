"""The backend's recipe store: a process-wide table of recipes by key, in front of the disk cache."""

from __future__ import annotations

import logging
import threading
from typing import Any

from .recipe import Recipe
from .settings import Settings

log = logging.getLogger(__name__)


class RecipeStore:
    """Recipes by key in this process; the disk tier (recipecache) sits behind it when enabled."""

    def __init__(self, disk=None):
        self.disk = disk
        self.recipes: dict[str, Recipe] = {}
        self.lock = threading.Lock()

    def get(self, key: str) -> Recipe | None:
        recipe = self.recipes.get(key)
        if recipe is None and self.disk is not None:
            recipe = self._load(key)
        return recipe

    def _load(self, key: str) -> Recipe | None:
        return None

    def put(self, key: str, recipe: Recipe, parts: dict[str, str], detail: dict[str, Any],
            settings: Settings) -> None:
        with self.lock:
            self.recipes[key] = recipe


_stores: dict[Any, RecipeStore] = {}
_stores_lock = threading.Lock()


def store_for(settings: Settings) -> RecipeStore:
    """The process-wide store for these settings' cache configuration."""
    cfg = (settings.cache, settings.cache_config)
    with _stores_lock:
        if cfg not in _stores:
            _stores[cfg] = RecipeStore()
        return _stores[cfg]
