"""The administration calls behind the CLI (peek, list, evict, remove, clear, verify, push, stats): those that
change the directory let pending writes land, hold eviction.lock and report disk trouble as CacheError."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable

from .accounting import Accounting
from .disk import FileItem, discard, read_file
from .entry import Entry, EntryInfo, decode_as, decode_entry, validate_key
from .errors import CacheError, CacheTimeout, CorruptEntry
from .eviction import TRIM_RATIO, select
from .ledger import Ledger
from .remote import RemoteTier, clean

logger = logging.getLogger("recipecache")


class Admin:
    """Inspection and whole-directory operations over one cache's accounting; ``drain`` waits for the
    cache's pending writes."""

    def __init__(self, space: Accounting, drain: Callable[[], None]):
        self.space = space
        self.disk = space.disk
        self._drain = drain

    @contextmanager
    def _held(self):
        """Hold the lock, after pending writes land; disk trouble is a CacheError here."""
        self._drain()
        try:
            with self.space.lock.hold():
                yield
        except OSError as exc:
            raise CacheError(f"recipe cache at {self.disk.root}: {exc}") from exc

    def peek(self, key: str) -> Entry | None:
        """The entry under key as stored on disk, or None; counts no hit and keeps its recency (for inspection)."""
        validate_key(key)
        try:
            result = self.disk.read(key)
        except OSError:
            return None
        try:
            return None if result is None or result.problem else decode_as(key, result.data)
        except CorruptEntry:
            return None

    def entries(self) -> list[EntryInfo]:
        """Every readable entry (headers only), with per-entry hit counts; sorted by key."""
        hits = self.space.stats.key_hits()
        infos = [info for info, ok in self.space.infos(self.disk.scan(), headers=True) if ok]
        return sorted((_with_hits(info, hits.get(info.key, 0)) for info in infos), key=lambda i: i.key)

    def evict(self, older_than_s=None, max_bytes=None, keys=None, predicate=None,
              dry_run: bool = False) -> list[EntryInfo]:
        """Plan (and unless dry_run, remove) entries matching all filters; no filter means trim to the limit."""
        space = self.space
        if keys is not None:
            keys = [validate_key(k) for k in keys]
        if (older_than_s, max_bytes, keys, predicate) == (None, None, None, None):
            if space.limit is None or space.ledger_now().directory_bytes <= space.limit:
                return []
            max_bytes = max(0, int(space.limit * TRIM_RATIO) - self.disk.overhead_bytes())
        with self._held():
            infos = [info for info, _ in space.infos(self.disk.scan(), headers=True)]
            victims = select(infos, space.policy, space.clock(), older_than_s, max_bytes, keys, predicate)
            if not dry_run:
                total = space.remove_locked(victims, sum(i.size for i in infos), "evict")
                space.ledger.write(Ledger(total, len(infos) - len(victims), space.clock(),
                                          self.disk.overhead_bytes()))
        if victims and not dry_run:
            self._persist_counters()
        return victims

    def _persist_counters(self) -> None:
        """Write the counters now: a command that evicts and exits drops its cache object before exit, and the
        batched counts with it (``stats`` would show no evictions)."""
        try:
            self.space.stats.flush()
        except (OSError, CacheTimeout) as exc:
            logger.warning("recipe cache at %s: eviction counters not saved: %s", self.disk.root, exc)

    def remove(self, key: str) -> bool:
        """Remove one entry from memory and disk; True if it was anywhere."""
        in_memory = self.space.memory.pop(validate_key(key))
        with self._held():
            path = self.disk.entry_path(key)
            on_disk = path.exists()
            if on_disk:
                size = path.stat().st_size
                self.space.evictions.append(key, size, "remove")
                on_disk = discard(path)
                self.space.adjust_locked(-size, -1)
        return in_memory or on_disk

    def clear(self) -> None:
        """Remove every entry (memory and disk); stats are kept (see reset_stats)."""
        self.space.memory.clear()
        with self._held():
            self.space.clear_locked("clear")
            self.space.stats.clear_hits()

    def verify(self, fix: bool = False, check: Callable[[bytes], str | None] | None = None) -> list[tuple[str, str]]:
        """(key or file name, reason) for every bad file; fix moves them to the quarantine folder.

        ``check(payload)`` may name what is wrong with an intact entry's payload (each file is read once)."""
        self._drain()
        bad = [(item.path, item.key, reason) for item in self.disk.scan()
               if (reason := self._check(item, check)) is not None]
        bad += [(path, path.name, reason) for path, reason in self.disk.foreign_files()]
        if fix and bad:
            with self._held():
                for path, _, _ in bad:
                    self._set_aside(path)
                self.space.reconcile_locked()
        return [(name, reason) for _, name, reason in bad]

    def _set_aside(self, path) -> None:
        """Quarantine one bad file; one that cannot be moved is reported and the others are still moved."""
        try:
            self.disk.quarantine(path)
        except OSError as exc:
            logger.warning("recipe cache: cannot move %s to the quarantine: %s", clean(path), exc.strerror or exc)

    def _check(self, item: FileItem, check: Callable[[bytes], str | None] | None) -> str | None:
        try:
            result = read_file(item.path, self.disk.allow_shared)
            if result is None:
                return None  # evicted while we looked
            if result.problem:
                return result.problem
            entry = decode_as(item.key, result.data)
        except CorruptEntry as exc:
            return str(exc)
        except OSError as exc:  # one file we may not read never stops the check of the others
            return f"unreadable ({exc.strerror or exc})"
        return None if check is None else check(entry.payload)

    def push(self, remote: RemoteTier | None, keys: list[str] | None = None) -> int:
        """Copy local entries (all, or these keys) to the fleet tier as they are on disk; how many went.
        ConnectionError if the server cannot be reached."""
        if remote is None:
            raise CacheError("no remote cache configured (HPU_RECIPE_CACHE_REMOTE or --remote)")
        self._drain()
        wanted = None if keys is None else set(keys)
        sent = 0
        for item in self.disk.scan():
            if wanted is not None and item.key not in wanted:
                continue
            data = self._intact(item)
            if data is None:
                continue  # never spread a damaged entry
            if not remote.put(item.key, data):
                raise ConnectionError(f"remote cache {remote.url} is unavailable")
            sent += 1
        return sent

    def keys(self) -> list[str]:
        """The key of every entry file on disk (names only: nothing is read)."""
        return [item.key for item in self.disk.scan()]

    def stats(self, enabled: bool) -> dict:
        """The counters, the ledger's totals and the tiers' state."""
        ledger, limit = self.space.ledger_now(), self.space.limit
        return {**self.space.stats.counters(), "entries": ledger.count, "total_bytes": ledger.total,
                "metadata_bytes": ledger.overhead, "limit_bytes": -1 if limit is None else limit,
                "path": str(self.disk.root), "enabled": enabled, "memory_entries": len(self.space.memory)}

    def reset_stats(self) -> None:
        try:
            self.space.stats.reset()
        except OSError as exc:
            raise CacheError(f"recipe cache at {self.disk.root}: cannot reset stats: {exc}") from exc

    def _intact(self, item: FileItem) -> bytes | None:
        """The bytes of an entry file that decodes cleanly, else None."""
        try:
            result = read_file(item.path, self.disk.allow_shared)
            if result is None or result.problem:
                return None
            decode_entry(result.data)
        except (CorruptEntry, OSError):  # a VersionMismatch too; or a file we may not read
            return None
        return result.data


def _with_hits(info: EntryInfo, hits: int) -> EntryInfo:
    return EntryInfo(info.key, info.size, info.created, info.last_used, hits, info.meta)
