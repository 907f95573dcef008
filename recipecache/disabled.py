"""The cache with a limit of 0 (``<path>,<delete>,0``): a null object, and ``open_cache``, which picks it."""

from __future__ import annotations

from .cache import RecipeCache
from .config import CacheConfig
from .entry import Entry, EntryInfo, validate_key, validate_meta
from .errors import CacheError
from .stats import COUNTERS


def open_cache(config: CacheConfig | None = None, **kwargs) -> RecipeCache:
    """The cache for ``config`` (default: the environment's): a DisabledCache for a limit of 0, else a
    RecipeCache opened with ``kwargs``."""
    config = CacheConfig.from_env() if config is None else config
    return DisabledCache(config) if config.limit_bytes == 0 else RecipeCache(config, **kwargs)


class DisabledCache(RecipeCache):
    """Nothing is stored or found and no directory is touched; every call keeps its signature, validation
    and return type."""

    def __init__(self, config: CacheConfig | None = None, problem: str | None = None):
        """``problem``: why a cache that was asked for is off (it could not be opened), if it is."""
        self.config = CacheConfig.from_env() if config is None else config
        self.path = self.config.resolved_path()
        self._problem = problem or "the cache is disabled"

    enabled = False

    @property
    def disk_problem(self) -> str:
        return self._problem

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
