"""RecipeCache: get and put over the tiers (memory → local disk → fleet), disk writes in the background.

Around this core: the background writes and the switch to memory only in persist.py, the size
accounting in accounting.py, the administration calls (peek, list, evict, verify, push, stats) in admin.py,
and the disabled cache (and ``open_cache``, which picks it for a limit of 0) in disabled.py.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from functools import partial
from typing import Callable

from .accounting import RECONCILE_INTERVAL_S, Accounting
from .admin import Admin
from .config import CacheConfig, record
from .disk import DiskStore
from .entry import Entry, EntryInfo, decode_as, validate_key, validate_meta
from .errors import CacheError, CacheTimeout, ConfigError, CorruptEntry, VersionMismatch
from .memory import MemoryTier
from .persist import Persister
from .remote import RemoteTier
from .stats import StatsStore

__all__ = ["RecipeCache", "RECONCILE_INTERVAL_S", "TOUCH_INTERVAL_S"]

logger = logging.getLogger("recipecache")

# A hit refreshes an entry's mtime (its LRU recency) at most this often, so hot hits write nothing.
TOUCH_INTERVAL_S = 60.0


class RecipeCache:
    """A size-bounded recipe store shared by the processes using one directory; get/put never raise for disk
    trouble (CacheError only for a directory others can write, and from the admin calls evict/remove/clear)."""

    def __init__(self, config: CacheConfig | None = None, clock=time.time,
                 cost_of: Callable[[dict], float] | None = None, remote_namespace: str = "", inspect: bool = False):
        """``cost_of(meta)``: the seconds an entry took to make (counted as saved on each disk hit).
        ``remote_namespace``: a prefix for this caller's entries in the remote tier (e.g. a toolchain).
        ``inspect``: open an existing cache to look at it: nothing is created, the configuration is not
        recorded and the limit is not applied (only evict, clear and writes apply it).
        ``open_cache(config)`` gives the disabled cache for a limit of 0."""
        self.config = CacheConfig.from_env() if config is None else config
        self._inspect = inspect
        self._cost_of = cost_of
        self._remote = self._open_remote(remote_namespace) if self.config.remote else None
        self.path = self.config.resolved_path()
        self._clock = clock
        self._memory = MemoryTier(self.config.memory_entries)
        self._disk = DiskStore(self.path, self.config.fsync)
        limit = self.config.limit_bytes
        self._disk.quarantine_bytes = None if not limit else limit // 16  # the quarantine: a small part of it
        self._stats = StatsStore(self.path, self.config.lock_timeout_s)
        self._space = Accounting(self._disk, self.config, self._memory, self._stats, clock)
        self._writes = Persister(self._space, self._remote, self.path)
        self._admin = Admin(self._space, self._writes.writer.drain)
        self._open()
        atexit.register(_flush_at_exit, weakref.ref(self))

    def _open_remote(self, namespace: str) -> RemoteTier | None:
        try:
            return RemoteTier(self.config.remote, self.config.remote_ttl_s, namespace)
        except ConfigError as exc:  # e.g. no redis client: the local tiers still work
            logger.warning("recipe cache: %s; continuing without the remote tier", exc)
            return None

    def _open(self) -> None:
        try:
            self._disk.open(self.config.allow_shared_dir, create=not self._inspect)
            if self._inspect:
                return
            record(self.path, self.config)
            if self.config.delete_on_start:
                self._space.clear_on_start()
        except OSError as exc:
            self._writes.degrade(exc)
            return
        except CacheTimeout as exc:
            logger.warning("recipe cache: delete_on_start skipped: %s", exc)
        self._writes.submit(self._space.maintain)

    @property
    def enabled(self) -> bool:
        """False when the disk tier degraded to memory only (or the cache is disabled)."""
        return self._writes.degraded is None

    @property
    def disk_problem(self) -> str | None:
        """Why the disk tier stopped writing (a read-only, full or vanished disk), or None."""
        return self._writes.degraded

    # -- reading ----------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The payload stored under key, or None; a bad or vanished entry is a miss, never an exception."""
        entry = self.get_entry(key)
        return None if entry is None else entry.payload

    def get_entry(self, key: str) -> Entry | None:
        validate_key(key)
        entry = self._from_memory(key)
        if entry is None:
            entry = self._load(key) or self._from_remote(key)
            if entry is None:
                self._stats.add(misses=1)
        self._writes.schedule_stats()
        return entry

    def _from_memory(self, key: str) -> Entry | None:
        found = self._memory.get(key)
        if found is None:
            entry = self._writes.pending(key)
            if entry is not None:
                self._stats.hit(key)
            return entry
        entry, touched = found
        self._stats.hit(key)
        now = self._clock()
        if now - touched >= TOUCH_INTERVAL_S:
            self._touch(key, now)
            self._memory.set_touched(key, now)
        return entry

    def _load(self, key: str) -> Entry | None:
        try:
            result = self._disk.read(key)
        except OSError as exc:
            logger.debug("recipe cache: cannot read %s: %s", key, exc)
            return None
        entry = None if result is None else self._decode(key, result)
        if entry is None:
            return None
        now = self._clock()
        touched = self._touch(key, now) if now - result.mtime >= TOUCH_INTERVAL_S else result.mtime
        self._memory.put(entry, touched)
        self._stats.hit(key, disk_hits=1, compile_time_saved_s=self._saved(entry.meta))
        return entry

    def _from_remote(self, key: str, check: Callable[[bytes], str | None] | None = None) -> Entry | None:
        """The entry from the fleet tier, written back to the local disk in the background; a corrupt
        remote entry (or one whose payload ``check`` finds a problem with) is a miss and is deleted there."""
        data = self._remote.get(key) if self._remote is not None else None
        if data is None:
            return None
        try:
            entry = decode_as(key, data)
            problem = None if check is None else check(entry.payload)
            if problem is not None:
                raise CorruptEntry(problem)
        except CorruptEntry as exc:  # a VersionMismatch too
            logger.warning("recipe cache: deleting unusable remote entry %s: %s", key, exc)
            self._stats.add(corrupt=1)
            self._remote.delete_if(key, lambda stored: stored == data)
            return None
        self._memory.put(entry, self._clock())
        self._writes.enqueue(entry, push=False)
        self._stats.hit(key, remote_hits=1, compile_time_saved_s=self._saved(entry.meta))
        return entry

    def _decode(self, key: str, result) -> Entry | None:
        """The entry read from disk, or None after scheduling the removal of an unusable file."""
        try:
            if result.problem:
                raise CorruptEntry(result.problem)
            return decode_as(key, result.data)
        except VersionMismatch as exc:
            logger.info("recipe cache: dropping %s: %s", key, exc)
            self._writes.submit(self._space.discard, key, result.ident, False)
        except CorruptEntry as exc:
            logger.warning("recipe cache: quarantining corrupt entry %s: %s", key, exc)
            self._stats.add(corrupt=1)
            self._writes.submit(self._space.discard, key, result.ident, True)
        return None

    def _touch(self, key: str, now: float) -> float:
        try:
            self._disk.touch(key, now)
        except (OSError, CorruptEntry) as exc:  # evicted or replaced meanwhile, read-only: recency is best effort
            logger.debug("recipe cache: cannot touch %s: %s", key, exc)
        return now

    def contains(self, key: str) -> bool:
        validate_key(key)
        return self._writes.pending(key) is not None or key in self._memory or self._disk.exists(key)

    # -- writing ----------------------------------------------------------------------------------------

    def put(self, key: str, payload: bytes, meta: dict | None = None, *, wait: bool = False) -> None:
        """Store payload under key (write-once); the disk write runs in the background unless wait=True."""
        validate_key(key)
        meta = validate_meta(meta)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        entry = Entry(key, bytes(payload), meta, self._clock())
        if key not in self._memory:
            self._memory.put(entry, entry.created)
        if self._writes.enqueue(entry) and wait:
            self._writes.writer.drain()

    def flush(self) -> None:
        """Wait for pending background writes, then persist the batched stats."""
        self._writes.flush()

    def quarantine(self, key: str, payload: bytes) -> None:
        """Set aside the entry under key if it still holds ``payload``: its reader found it unusable
        (the checksum held, the content did not). Later gets miss; the disk change runs in the
        background, and a fresh entry written under the key meanwhile is left alone."""
        validate_key(key)
        self._memory.pop(key)
        self._writes.forget(key, payload)
        if self._writes.degraded is None:
            self._stats.add(corrupt=1)
            self._writes.submit(self._space.quarantine_if_same, key, bytes(payload))
        if self._remote is not None:  # every host would fetch it again: delete it in the fleet tier too
            self._writes.writer.submit(partial(self._remote.delete_if, key, partial(_holds, key, bytes(payload))))

    # -- administration and numbers (CLI): see admin.py ------------------------------------------------------

    def peek(self, key: str) -> Entry | None:
        return self._admin.peek(key)

    def entries(self) -> list[EntryInfo]:
        return self._admin.entries()

    def evict(self, older_than_s=None, max_bytes=None, keys=None, predicate=None,
              dry_run: bool = False) -> list[EntryInfo]:
        return self._admin.evict(older_than_s, max_bytes, keys, predicate, dry_run)

    def remove(self, key: str) -> bool:
        return self._admin.remove(key)

    def clear(self) -> None:
        self._admin.clear()

    def verify(self, fix: bool = False, check: Callable[[bytes], str | None] | None = None) -> list[tuple[str, str]]:
        return self._admin.verify(fix, check)

    @property
    def remote(self) -> RemoteTier | None:
        return self._remote

    def push(self, keys: list[str] | None = None) -> int:
        return self._admin.push(self._remote, keys)

    def pull(self, keys: list[str], check: Callable[[bytes], str | None] | None = None) -> int:
        """Fetch the entries under keys that this host lacks from the fleet tier; how many arrived. An entry
        whose payload ``check`` finds a problem with is not kept, and is deleted in the fleet tier."""
        if self._remote is None:
            raise CacheError("no remote cache configured (HPU_RECIPE_CACHE_REMOTE or --remote)")
        got = sum(1 for k in keys if not self.contains(k) and self._from_remote(k, check) is not None)
        self.flush()
        return got

    def keys(self) -> list[str]:
        return self._admin.keys()

    def total_bytes(self) -> int:
        return self._space.ledger_now().total

    def stats(self) -> dict:
        return self._admin.stats(self.enabled)

    def reset_stats(self) -> None:
        self._admin.reset_stats()

    def _saved(self, meta: dict) -> float:
        try:
            return float(self._cost_of(meta)) if self._cost_of is not None else 0.0
        except (TypeError, ValueError):
            return 0.0


def _holds(key: str, payload: bytes, data: bytes) -> bool:
    """Whether the entry bytes ``data`` hold ``payload`` (or are no usable entry at all)."""
    try:
        return decode_as(key, data).payload == payload
    except CorruptEntry:
        return True


def _flush_at_exit(ref) -> None:
    cache = ref()
    if cache is not None:
        cache.flush()
