"""RecipeCache: the memory tier, the disk tier and the background writer behind one small API."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Callable

from . import startup
from .config import CacheConfig, record
from .disk import DiskStore, FileItem, discard, identity, read_file
from .entry import Entry, EntryInfo, decode_entry, encode_entry, validate_key, validate_meta
from .errors import CacheError, CacheTimeout, ConfigError, CorruptEntry, VersionMismatch
from .eviction import TRIM_RATIO, Candidate, EvictionLog, log_removal, plan_trim, select
from .ledger import Ledger, LedgerFile
from .locks import DirLock
from .memory import MemoryTier
from .remote import RemoteTier
from .stats import COUNTERS, StatsStore
from .writer import BackgroundWriter

logger = logging.getLogger("recipecache")

# A hit refreshes an entry's mtime (its LRU recency) at most this often, so hot hits write nothing.
TOUCH_INTERVAL_S = 60.0
# The size ledger is confirmed by a real directory scan at least this often (cache clock).
RECONCILE_INTERVAL_S = 300.0
# Counters gathered by reads are handed to the background writer at most this often.
STATS_FLUSH_S = 5.0
# Removals for these reasons count as evictions in the stats.
_EVICTION_REASONS = ("limit", "evict")


class RecipeCache:
    """A size-bounded recipe store shared by the processes using one directory; get/put never raise for disk
    trouble (CacheError only for a directory others can write, and from the admin calls evict/remove/clear)."""

    def __new__(cls, config: CacheConfig | None = None, *args, **kwargs):
        """A limit of 0 gives a DisabledCache: the same calls, none of which stores or finds anything."""
        config = CacheConfig.from_env() if config is None else config
        return super().__new__(DisabledCache if cls is RecipeCache and config.limit_bytes == 0 else cls)

    def __init__(self, config: CacheConfig | None = None, clock=time.time,
                 cost_of: Callable[[dict], float] | None = None, remote_namespace: str = ""):
        """``cost_of(meta)``: the seconds an entry took to make (counted as saved on each disk hit).
        ``remote_namespace``: a prefix for this caller's entries in the remote tier (e.g. a toolchain)."""
        self.config = CacheConfig.from_env() if config is None else config
        self._cost_of = cost_of
        self._remote = self._open_remote(remote_namespace) if self.config.remote else None
        self.path = self.config.resolved_path()
        self._clock = clock
        self._limit = self.config.limit_bytes
        self._memory = MemoryTier(self.config.memory_entries)
        self._pending: dict[str, Entry] = {}  # queued for the disk, still readable from here
        self._mutex = threading.Lock()
        self._degraded: str | None = None
        self._disk = DiskStore(self.path, self.config.fsync)
        self._disk.quarantine_bytes = None if not self._limit else self._limit // 16
        self._lock = DirLock(self.path / "eviction.lock", self.config.lock_timeout_s)
        self._ledger = LedgerFile(self.path / "size.json")
        self._evictions = EvictionLog(self.path / "evictions.log", self._limit)
        self._stats = StatsStore(self.path, self.config.lock_timeout_s)
        self._writer = BackgroundWriter("recipecache-writer", on_idle=self._flush_stats)
        self._open()
        atexit.register(_flush_at_exit, weakref.ref(self))

    def _open_remote(self, namespace: str) -> RemoteTier | None:
        try:
            return RemoteTier(self.config.remote, self.config.remote_ttl_s, namespace)
        except ConfigError as exc:  # e.g. no redis client: the local tiers still work
            logger.warning("recipe cache: %s; continuing without the remote tier", exc)
            return None

    @property
    def enabled(self) -> bool:
        """False when the disk tier degraded to memory only (or the cache is disabled)."""
        return self._degraded is None

    # -- opening ----------------------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self._disk.open(self.config.allow_shared_dir)
            record(self.path, self.config)
            if self.config.delete_on_start:
                self._clear_on_start()
        except OSError as exc:
            self._degrade(exc)
            return
        except CacheTimeout as exc:
            logger.warning("recipe cache: delete_on_start skipped: %s", exc)
        self._writer.submit(partial(self._disk_job, self._maintain))

    def _clear_on_start(self) -> None:
        startup.claim_launch()
        marker, launch = self.path / "clear.marker", startup.launch_id()
        with self._lock.hold():
            if startup.should_clear(startup.read_marker(marker), launch):
                self._clear_locked("delete_on_start")
                startup.write_marker(marker, launch)

    def _maintain(self) -> None:
        """Sweep temp files of killed writers and confirm the ledger when it is missing or old."""
        self._disk.sweep_temps()
        ledger = self._ledger.read()
        if ledger is None or self._clock() - ledger.reconciled > RECONCILE_INTERVAL_S:
            with self._lock.hold():
                self._reconcile_locked()

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
        self._schedule_stats()
        return entry

    def _from_remote(self, key: str) -> Entry | None:
        """The entry from the fleet tier, written back to the local disk in the background; a corrupt
        remote entry is a miss and is deleted there."""
        data = self._remote.get(key) if self._remote is not None else None
        if data is None:
            return None
        try:
            entry = _decode_as(key, data)
        except (CorruptEntry, VersionMismatch) as exc:
            logger.warning("recipe cache: deleting unusable remote entry %s: %s", key, exc)
            self._stats.add(corrupt=1)
            self._remote.delete(key)
            return None
        self._memory.put(entry, self._clock())
        if self._degraded is None:
            self._enqueue(entry, push=False)
        self._stats.hit(key, remote_hits=1, compile_time_saved_s=self._saved(entry.meta))
        return entry

    def _from_memory(self, key: str) -> Entry | None:
        found = self._memory.get(key)
        if found is None:
            with self._mutex:
                entry = self._pending.get(key)
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
        if result is None:
            return None
        entry = self._decode(key, result)
        if entry is None:
            return None
        now = self._clock()
        touched = self._touch(key, now) if now - result.mtime >= TOUCH_INTERVAL_S else result.mtime
        self._memory.put(entry, touched)
        self._stats.hit(key, disk_hits=1, compile_time_saved_s=self._saved(entry.meta))
        return entry

    def _decode(self, key: str, result) -> Entry | None:
        try:
            if result.problem:
                raise CorruptEntry(result.problem)
            return _decode_as(key, result.data)
        except VersionMismatch as exc:
            logger.info("recipe cache: dropping %s: %s", key, exc)
            self._submit_discard(key, result.ident, quarantine=False)
        except CorruptEntry as exc:
            logger.warning("recipe cache: quarantining corrupt entry %s: %s", key, exc)
            self._stats.add(corrupt=1)
            self._submit_discard(key, result.ident, quarantine=True)
        return None

    def _touch(self, key: str, now: float) -> float:
        try:
            self._disk.touch(key, now)
        except OSError as exc:  # evicted meanwhile, or a read-only cache: recency is best effort
            logger.debug("recipe cache: cannot touch %s: %s", key, exc)
        return now

    def peek(self, key: str) -> Entry | None:
        """The entry under key as stored on disk, or None; counts no hit and keeps its recency (for inspection)."""
        validate_key(key)
        try:
            result = self._disk.read(key)
        except OSError:
            return None
        try:
            return None if result is None or result.problem else _decode_as(key, result.data)
        except CorruptEntry:
            return None

    def contains(self, key: str) -> bool:
        validate_key(key)
        with self._mutex:
            if key in self._pending:
                return True
        return key in self._memory or self._disk.exists(key)

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
        if self._degraded is None and self._enqueue(entry) and wait:
            self._writer.drain()

    def _enqueue(self, entry: Entry, push: bool = True) -> bool:
        with self._mutex:
            if entry.key in self._pending:
                return False
            self._pending[entry.key] = entry
        self._writer.submit(partial(self._write_job, entry, push and self._remote is not None))
        return True

    def flush(self) -> None:
        """Wait for pending background writes, then persist the batched stats."""
        self._writer.drain()
        self._flush_stats()

    def _write_job(self, entry: Entry, push: bool = False) -> None:
        try:
            self._disk_job(partial(self._store, entry))
        finally:
            with self._mutex:
                self._pending.pop(entry.key, None)
        if push:  # local first, then the fleet
            self._remote.put(entry.key, encode_entry(entry.key, entry.payload, entry.meta, entry.created))

    def _store(self, entry: Entry) -> None:
        if self._degraded is not None or self._disk.exists(entry.key):
            return
        data = encode_entry(entry.key, entry.payload, entry.meta, entry.created)
        if self._limit is not None and len(data) > self._limit:
            logger.warning("recipe cache: entry %s (%d bytes) is larger than the cache limit (%d bytes); "
                           "not stored on disk", entry.key, len(data), self._limit)
            return
        tmp = self._disk.write_temp(entry.key, data, entry.created)
        try:
            with self._lock.hold():
                published = self._publish_locked(tmp, entry.key, len(data))
        finally:
            discard(tmp)
        if published:
            self._stats.add(bytes_written=len(data))

    def _disk_job(self, job) -> None:
        """Run a background disk job; disk trouble degrades the tier, a lock timeout skips the job."""
        try:
            job()
        except CacheTimeout as exc:
            logger.warning("recipe cache: skipped a background write: %s", exc)
        except OSError as exc:
            self._degrade(exc)

    def _degrade(self, exc: OSError) -> None:
        with self._mutex:
            if self._degraded is not None:
                return
            self._degraded = str(exc)
        logger.warning("recipe cache at %s: disk tier disabled (%s); continuing with the in-memory tier only",
                       self.path, exc)

    # -- size accounting and eviction (all *_locked methods run under eviction.lock) ---------------------

    def _publish_locked(self, tmp, key: str, size: int) -> bool:
        """Count the entry, then publish it, then trim if over the limit.

        Counting first means a writer killed in between leaves the ledger over, never under, the real total, so
        the real total never exceeds a ledger that says we are within the limit."""
        ledger = self._ledger.read()
        if ledger is None or self._clock() - ledger.reconciled > RECONCILE_INTERVAL_S:
            self._disk.sweep_temps()  # long-running processes sweep killed writers' leftovers here too
            ledger = self._reconcile_locked()
        self._ledger.write(ledger.add(size))
        if not self._disk.publish(tmp, key):
            self._ledger.write(ledger)  # another process published it first
            return False
        if self._limit is not None and ledger.directory_bytes + size > self._limit:
            self._reconcile_locked()
        return True

    def _reconcile_locked(self) -> Ledger:
        """Recount the directory, trim it to TRIM_RATIO of the limit if it is over (bookkeeping files,
        manifests and the quarantine count against the limit too), and record the result."""
        items = self._disk.scan()
        total = sum(item.size for item in items)
        overhead = self._disk.overhead_bytes()
        removed = []
        if self._limit is not None and total + overhead > self._limit:
            target = max(0, int(self._limit * TRIM_RATIO) - overhead)
            removed = plan_trim(self._candidates(items), self.config.policy, target)
            total = self._remove_locked(removed, total, "limit")
        ledger = Ledger(total, len(items) - len(removed), self._clock(), overhead)
        self._ledger.write(ledger)
        return ledger

    def _candidates(self, items: list[FileItem]) -> list[Candidate]:
        if self.config.policy == "created":  # creation time lives in the header
            return [Candidate(info.key, info.size, info.created, info.last_used)
                    for info, _ in self._infos(items, headers=True)]
        return [Candidate(item.key, item.size, item.mtime, item.mtime) for item in items]

    def _remove_locked(self, victims: list, total: int, reason: str) -> int:
        """Remove victims, logging each before its file goes; returns the total left."""
        for victim in victims:
            self._evictions.append(victim.key, victim.size, reason)
            self._memory.pop(victim.key)
            if not discard(self._disk.entry_path(victim.key)):
                continue
            total -= victim.size
            if reason in _EVICTION_REASONS:
                log_removal(victim.key, total)
                self._stats.add(evictions=1, bytes_evicted=victim.size)
        return total

    def _infos(self, items: list[FileItem], headers: bool) -> list[tuple[EntryInfo, bool]]:
        """EntryInfo per file and whether its header read cleanly (bad files sort as created at 0)."""
        return [self._info(item, headers) for item in items]

    def _info(self, item: FileItem, headers: bool) -> tuple[EntryInfo, bool]:
        if not headers:
            return EntryInfo(item.key, item.size, item.mtime, item.mtime), True
        try:
            header = self._disk.read_header(item.path)
        except (OSError, CorruptEntry):
            return EntryInfo(item.key, item.size, 0.0, item.mtime), False
        ok = header.key == item.key
        return EntryInfo(item.key, item.size, header.created if ok else 0.0, item.mtime, 0, header.meta), ok

    def quarantine(self, key: str, payload: bytes) -> None:
        """Set aside the entry under key if it still holds ``payload``: its reader found it unusable
        (the checksum held, the content did not). Later gets miss; the disk change runs in the
        background, and a fresh entry written under the key meanwhile is left alone."""
        validate_key(key)
        self._memory.pop(key)
        with self._mutex:
            pending = self._pending.get(key)
            if pending is not None and pending.payload == payload:
                del self._pending[key]
        if self._degraded is not None:
            return
        self._stats.add(corrupt=1)
        self._writer.submit(partial(self._disk_job, partial(self._quarantine_if_same, key, bytes(payload))))

    def _quarantine_if_same(self, key: str, payload: bytes) -> None:
        with self._lock.hold():
            result = self._disk.read(key)
            if result is None:
                return
            try:
                if decode_entry(result.data).payload != payload:
                    return  # replaced by a fresh entry since it was read
            except (CorruptEntry, VersionMismatch):
                pass  # unreadable on disk as well: set it aside all the same
            if self._disk.quarantine(self._disk.entry_path(key)):
                self._reconcile_locked()

    def _submit_discard(self, key: str, ident: tuple, quarantine: bool) -> None:
        if self._degraded is None:
            self._writer.submit(partial(self._disk_job, partial(self._discard, key, ident, quarantine)))

    def _discard(self, key: str, ident: tuple, quarantine: bool) -> None:
        path = self._disk.entry_path(key)
        with self._lock.hold():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return
            if identity(st) != ident:
                return  # replaced by a fresh entry since we read the bad one
            if quarantine and self._disk.quarantine(path):
                self._reconcile_locked()  # rare, and a damaged file's size says nothing about what was counted
            elif not quarantine and discard(path):
                self._adjust_locked(-st.st_size, -1)  # an intact old-format file: common after an upgrade

    def _adjust_locked(self, size: int, entries: int) -> None:
        ledger = self._ledger.read()
        if ledger is None:
            self._reconcile_locked()
        else:
            self._ledger.write(ledger.add(size, entries))

    # -- administration (CLI) ---------------------------------------------------------------------------

    @contextmanager
    def _admin(self):
        """Hold the lock for an admin call, after pending writes land; disk trouble is a CacheError here."""
        self._writer.drain()
        try:
            with self._lock.hold():
                yield
        except OSError as exc:
            raise CacheError(f"recipe cache at {self.path}: {exc}") from exc

    def entries(self) -> list[EntryInfo]:
        """Every readable entry (headers only), with per-entry hit counts; sorted by key."""
        hits = self._stats.key_hits()
        infos = [info for info, ok in self._infos(self._disk.scan(), headers=True) if ok]
        return sorted((_with_hits(info, hits.get(info.key, 0)) for info in infos), key=lambda i: i.key)

    def evict(self, older_than_s=None, max_bytes=None, keys=None, predicate=None,
              dry_run: bool = False) -> list[EntryInfo]:
        """Plan (and unless dry_run, remove) entries matching all filters; no filter means trim to the limit."""
        if keys is not None:
            keys = [validate_key(k) for k in keys]
        if (older_than_s, max_bytes, keys, predicate) == (None, None, None, None):
            if self._limit is None or self._ledger_now().directory_bytes <= self._limit:
                return []
            max_bytes = max(0, int(self._limit * TRIM_RATIO) - self._disk.overhead_bytes())
        with self._admin():
            infos = [info for info, _ in self._infos(self._disk.scan(), headers=True)]
            victims = select(infos, self.config.policy, self._clock(), older_than_s, max_bytes, keys, predicate)
            if not dry_run:
                total = self._remove_locked(victims, sum(i.size for i in infos), "evict")
                self._ledger.write(Ledger(total, len(infos) - len(victims), self._clock(),
                                          self._disk.overhead_bytes()))
        return victims

    def remove(self, key: str) -> bool:
        """Remove one entry from memory and disk; True if it was anywhere."""
        validate_key(key)
        in_memory = self._memory.pop(key)
        with self._admin():
            path = self._disk.entry_path(key)
            on_disk = path.exists()
            if on_disk:
                size = path.stat().st_size
                self._evictions.append(key, size, "remove")
                on_disk = discard(path)
                self._adjust_locked(-size, -1)
        return in_memory or on_disk

    def clear(self) -> None:
        """Remove every entry (memory and disk); stats are kept (see reset_stats)."""
        self._memory.clear()
        with self._admin():
            self._clear_locked("clear")
            self._stats.clear_hits()

    def _clear_locked(self, reason: str) -> None:
        items = self._disk.scan()
        for item in items:
            self._evictions.append(item.key, item.size, reason)
            discard(item.path)
        self._ledger.write(Ledger(0, 0, self._clock()))
        logger.info("recipe cache at %s: %s removed %d entries", self.path, reason, len(items))

    def verify(self, fix: bool = False, check: Callable[[bytes], str | None] | None = None) -> list[tuple[str, str]]:
        """(key or file name, reason) for every bad file; fix moves them to the quarantine folder.

        ``check(payload)`` may name what is wrong with an intact entry's payload (each file is read once)."""
        self._writer.drain()
        bad = [(item.path, item.key, reason) for item in self._disk.scan()
               if (reason := self._check(item, check)) is not None]
        bad += [(path, path.name, reason) for path, reason in self._disk.foreign_files()]
        if fix and bad:
            with self._admin():
                for path, _, _ in bad:
                    self._disk.quarantine(path)
                self._reconcile_locked()
        return [(name, reason) for _, name, reason in bad]

    def _check(self, item: FileItem, check: Callable[[bytes], str | None] | None) -> str | None:
        try:
            result = read_file(item.path, self._disk.allow_shared)
            if result is None:
                return None  # evicted while we looked
            if result.problem:
                return result.problem
            entry = _decode_as(item.key, result.data)
        except CorruptEntry as exc:
            return str(exc)
        return None if check is None else check(entry.payload)

    # -- the fleet tier ---------------------------------------------------------------------------------------

    @property
    def remote(self) -> RemoteTier | None:
        return self._remote

    def push(self, keys: list[str] | None = None) -> int:
        """Copy local entries (all, or these keys) to the fleet tier as they are on disk; how many went.
        ConnectionError if the server cannot be reached."""
        if self._remote is None:
            raise CacheError("no remote cache configured (HPU_RECIPE_CACHE_REMOTE or --remote)")
        self._writer.drain()
        wanted = None if keys is None else set(keys)
        sent = 0
        for item in self._disk.scan():
            if wanted is not None and item.key not in wanted:
                continue
            result = read_file(item.path, self._disk.allow_shared)
            if result is None or result.problem:
                continue
            try:
                decode_entry(result.data)
            except (CorruptEntry, VersionMismatch):
                continue  # never spread a damaged entry
            if not self._remote.put(item.key, result.data):
                raise ConnectionError(f"remote cache {self._remote.url} is unavailable")
            sent += 1
        return sent

    def pull(self, keys: list[str]) -> int:
        """Fetch the entries under keys that this host lacks from the fleet tier; how many arrived."""
        if self._remote is None:
            raise CacheError("no remote cache configured (HPU_RECIPE_CACHE_REMOTE or --remote)")
        got = sum(1 for k in keys if not self.contains(k) and self._from_remote(k) is not None)
        self.flush()
        return got

    # -- numbers ----------------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """The key of every entry file on disk (names only: nothing is read)."""
        return [item.key for item in self._disk.scan()]

    def total_bytes(self) -> int:
        """Bytes on disk as the shared ledger records them (a scan if there is no ledger)."""
        return self._ledger_now().total

    def _ledger_now(self) -> Ledger:
        ledger = self._ledger.read()
        if ledger is None:
            items = self._disk.scan()
            ledger = Ledger(sum(i.size for i in items), len(items), 0.0)
        return ledger

    def stats(self) -> dict:
        ledger = self._ledger_now()
        return {**self._stats.counters(), "entries": ledger.count, "total_bytes": ledger.total,
                "metadata_bytes": ledger.overhead,
                "limit_bytes": -1 if self._limit is None else self._limit, "path": str(self.path),
                "enabled": self.enabled, "memory_entries": len(self._memory)}

    def reset_stats(self) -> None:
        try:
            self._stats.reset()
        except OSError as exc:
            raise CacheError(f"recipe cache at {self.path}: cannot reset stats: {exc}") from exc

    def _flush_stats(self) -> None:
        if self._degraded is not None or not self._stats.dirty:
            return
        self._disk_job(self._stats.flush)

    def _saved(self, meta: dict) -> float:
        try:
            return float(self._cost_of(meta)) if self._cost_of is not None else 0.0
        except (TypeError, ValueError):
            return 0.0

    def _schedule_stats(self) -> None:
        # Reads only count in memory; hand a flush to the writer now and then so other processes see them.
        if self._stats.dirty and time.monotonic() - self._stats.last_flush > STATS_FLUSH_S:
            self._stats.last_flush = time.monotonic()
            self._writer.submit(self._flush_stats)


class DisabledCache(RecipeCache):
    """The cache with a limit of 0 (``<path>,<delete_on_start>,0``): nothing is stored or found, no
    directory is touched; every call keeps its signature, validation and return type."""

    def __init__(self, config: CacheConfig | None = None, clock=time.time, cost_of=None):
        self.config = CacheConfig.from_env() if config is None else config
        self.path = self.config.resolved_path()
        self._limit = 0

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


def _decode_as(key: str, data: bytes) -> Entry:
    """The entry in ``data``, which must be stored under ``key`` (CorruptEntry otherwise)."""
    entry = decode_entry(data)
    if entry.key != key:
        raise CorruptEntry(f"foreign entry: header key {entry.key!r}")
    return entry


def _with_hits(info: EntryInfo, hits: int) -> EntryInfo:
    return EntryInfo(info.key, info.size, info.created, info.last_used, hits, info.meta)


def _flush_at_exit(ref) -> None:
    cache = ref()
    if cache is not None:
        cache.flush()
