"""The backend's recipe store: recipes and programs by key, over the disk cache (recipecache).

The disk tier never fails a compile: a disk that cannot be opened (insecure, unwritable) means
"compile without caching" after one warning; an entry that cannot be used is quarantined and is a
miss. A store without caching holds the disabled cache (a null object), never None. Each session opens
its store (``RecipeStore.open``) and hands it down; nobody looks a store up again by its configuration.
A malformed cache configuration is an error, because it is a user's typo, not a machine's state.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from recipecache import CacheConfig, CacheError

if TYPE_CHECKING:
    from recipecache import RecipeCache

from .. import metrics
from ..formats.keyparts import miss_reasons, nearest, new_shape, toolchain_id
from .keys import ProgramKey
from ..formats.program import Program
from ..formats.recipe import Recipe, RecipeFormatError
from ..runtime import RecipeLoadError, check_ops
from ..settings import Settings

T = TypeVar("T")

log = logging.getLogger(__name__)


class RecipeStore:
    """Recipes and programs by key, in the disk cache ``disk`` (a RecipeCache; without one, the disabled cache).

    What the store hands out is always parsed from stored bytes — read on a hit, or just written
    on a put — so the caller runs exactly what a later process will load. Anything stored that
    fails to parse, validate or build is quarantined and counts as a miss.
    """

    def __init__(self, disk: RecipeCache | None = None, capacity: int = CacheConfig.memory_entries,
                 config: CacheConfig | None = None):
        self._disk = disk  # None: opened at first use, from ``config``
        self.config = config  # the configuration it was opened for (None: no caching)
        # How many buckets a compiled graph keeps taken up: the memory tier's size. A memory tier turned off
        # (0) keeps no entries, but a graph still needs its working set: the default size then.
        self.capacity = capacity if capacity > 0 else CacheConfig.memory_entries
        self._held: list[dict] | None = None  # the entries' metadata at the first miss, to explain misses by

    @property
    def disk(self) -> RecipeCache:
        """The disk cache, opened at first use: a process served by an artifact's own recipes never opens it."""
        if self._disk is None:
            with _opening:
                if self._disk is None:
                    self._disk = _open_disk(self.config)
        return self._disk

    def why_missed(self, kind: str, parts: dict[str, str], detail: dict[str, Any], name: str) -> tuple[str, ...]:
        """Why a lookup of a ``kind`` ("recipe" | "program") entry missed when the cache holds the same graph under
        another key: what differs, old → new (logged as a warning, counted in the metrics); () when it holds no
        such entry, or one for another shape only (a new shape is no key problem). The cache's index is read
        once, at the store's first miss: entries this process adds are its own, never the reason it missed."""
        if self._held is None:
            self._held = [info.meta for info in self.disk.entries()]
        old = nearest(self._held, kind, parts)
        reasons = () if old is None else tuple(miss_reasons(old, parts, detail))
        if new_shape(reasons):  # also () when nothing was found
            return ()
        log.warning("hpu_backend: %s missed the %s cache, which holds it under another key: %s", name, kind,
                    "; ".join(reasons))
        metrics.record_miss_reasons(reasons)
        return reasons

    def load(self, key: str, prepare: Callable[[Any], T], parse: Callable[[bytes], Any] = Recipe.from_bytes
             ) -> tuple[Any, T] | None:
        """``(parsed, prepare(parsed))`` for the entry under key, or None (missing or unusable)."""
        data = self.read(key)
        if data is None:
            return None
        try:
            parsed = parse(data)
            return parsed, prepare(parsed)
        except (RecipeFormatError, RecipeLoadError) as e:
            log.warning("hpu_backend: cache entry %s cannot be used (%s); quarantined, compiling instead", key, e)
            self.disk.quarantine(key, data)
            return None

    def read(self, key: str) -> bytes | None:
        """The stored bytes under key, or None."""
        return self.disk.get(key)

    def discard(self, key: str) -> None:
        """Quarantine the entry under key: it parsed, but failed when built or served (a miss from now on,
        here and, through the fleet tier, on other hosts)."""
        data = self.disk.get(key)
        if data is not None:
            self.disk.quarantine(key, data)

    def put(self, key: str | None, recipe: Recipe, meta: dict[str, Any]) -> Recipe:
        """Store ``recipe`` under key (None: not cached) and return it as parsed back from its bytes."""
        data = recipe.to_bytes()
        if key is not None:
            self.disk.put(key, data, meta)
        return type(recipe).from_bytes(data)


    @classmethod
    def open(cls, config: CacheConfig | None) -> "RecipeStore":
        """A store over the disk cache of ``config`` (None: a store that caches nothing)."""
        capacity = config.memory_entries if config is not None else CacheConfig.memory_entries
        return cls(None, capacity, config)

    def serves(self, config: CacheConfig | None) -> bool:
        """Whether this store was opened for ``config`` (the same directory, limits, policy and tiers)."""
        return _ident(self.config) == _ident(config)

    def flush(self) -> RecipeCache:
        """Wait until every recipe put so far is on disk; the disk cache."""
        self.disk.flush()
        return self.disk

    def load_program(self, key: str) -> Program | None:
        """The program under key, its graphs' ops checked against the runtime allowlist."""
        found = self.load(key, lambda program: [check_ops(g.template) for g in program.graphs], Program.from_bytes)
        return None if found is None else found[0]

    def put_program(self, pkey: ProgramKey, program: Program, settings: Settings, name: str) -> None:
        self.disk.put(pkey.key, program.to_bytes(), {
            "graph": name, "kind": "program", "mode": program.mode, "model": settings.model,
            "target": settings.target, "bucket": {}, "key_parts": dict(pkey.parts), "key_detail": dict(pkey.detail)})


def entry_meta(recipe: Recipe, parts: dict[str, str], detail: dict[str, Any], settings: Settings) -> dict:
    """What a recipe's cache entry says about itself (for ls, show, explain and stats)."""
    return {
        "graph": recipe.name, "kind": recipe.kind, "model": settings.model, "target": recipe.target,
        "bucket": {s: list(r) for s, r in recipe.bucket.items()},
        "compile_time_s": float(recipe.facts.get("compile_time_s", 0.0)),
        "key_parts": dict(parts),
        "key_detail": {k: detail[k] for k in ("settings", "toolchain", "bucket") if k in detail},
    }


def _ident(config: CacheConfig | None) -> tuple | None:
    return None if config is None else (str(config.resolved_path()), config.max_size_mb, config.policy,
                                        config.remote, config.memory_entries)


_opening = threading.Lock()


def _no_cache() -> RecipeCache:
    """The disabled cache: nothing stored or found, no directory touched."""
    from recipecache import DisabledCache

    return DisabledCache(CacheConfig(max_size_mb=0, remote="none"))


def _open_disk(config: CacheConfig | None) -> RecipeCache:
    """The disk cache of ``config``; the disabled cache for None, for a limit of 0, and for a disk that
    cannot be used (after one warning)."""
    from recipecache import DisabledCache, open_cache

    if config is None:
        return _no_cache()
    try:
        cache = open_cache(config, cost_of=_compile_time, remote_namespace=toolchain_id())
    except CacheError as e:
        log.warning("hpu_backend: recipe disk cache off, compiling without it: %s", e)
        return DisabledCache(config, str(e))
    return cache if cache.enabled else DisabledCache(config, cache.disk_problem)


def _compile_time(meta: dict) -> float:
    """What a hit on this entry saves: the lowering time recorded with it (counted in the cache's stats)."""
    value = meta.get("compile_time_s", 0.0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
