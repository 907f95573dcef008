"""The cache with a limit of 0: a null object that RecipeCache(config) returns for ``<path>,<delete>,0``."""

from __future__ import annotations

import time

from .cache import RecipeCache
from .config import CacheConfig
from .entry import Entry, EntryInfo, validate_key, validate_meta
from .errors import CacheError
from .stats import COUNTERS


class DisabledCache(RecipeCache):
    """Nothing is stored or found and no directory is touched; every call keeps its signature, validation
    and return type."""

    def __init__(self, config: CacheConfig | None = None, clock=time.time, cost_of=None, remote_namespace: str = ""):
        self.config = CacheConfig.from_env() if config is None else config
        self.path = self.config.resolved_path()

    enabled = False

    def get_entry(self, key: str) -> Entry | None:
        validate_key(key)
        return None

    def peek(self, key: str) -> Entry | None:
        validate_key(key)
        return None

    def contains(self, key: str) -> bool:
        validate_key(key)
        return False

    def put(self, key: str, payload: bytes, meta: dict | None = None, *, wait: bool = False) -> None:
        validate_key(key)
        validate_meta(meta)

    def quarantine(self, key: str, payload: bytes) -> None:
        validate_key(key)

    def flush(self) -> None:
        pass

    def entries(self) -> list[EntryInfo]:
        return []

    def evict(self, *args, **kwargs) -> list[EntryInfo]:
        return []

    def remove(self, key: str) -> bool:
        validate_key(key)
        return False

    def clear(self) -> None:
        pass

    def verify(self, fix: bool = False, check=None) -> list[tuple[str, str]]:
        return []

    remote = None

    def push(self, keys=None) -> int:
        raise CacheError("the recipe cache is disabled (max_size_mb 0)")

    pull = push

    def keys(self) -> list[str]:
        return []

    def total_bytes(self) -> int:
        return 0

    def stats(self) -> dict:
        return {**dict.fromkeys(COUNTERS, 0), "entries": 0, "total_bytes": 0, "metadata_bytes": 0, "limit_bytes": 0,
                "path": str(self.path), "enabled": False, "memory_entries": 0}

    def reset_stats(self) -> None:
        pass
