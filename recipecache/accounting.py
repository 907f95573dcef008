"""The disk tier's size accounting: the shared ledger, trimming to the limit, removals and quarantine,
each change made under eviction.lock so that the processes sharing a directory agree on its size."""

from __future__ import annotations

import logging
import os
from typing import Callable

from . import startup
from .config import CacheConfig
from .disk import DiskStore, FileItem, discard, identity
from .entry import EntryInfo, decode_entry
from .errors import CorruptEntry, VersionMismatch
from .eviction import EVICTIONS_LOG, TRIM_RATIO, Candidate, EvictionLog, log_removal, plan_trim
from .ledger import Ledger, LedgerFile
from .locks import DirLock
from .memory import MemoryTier
from .stats import StatsStore

logger = logging.getLogger("recipecache")

# The size ledger is confirmed by a real directory scan at least this often (cache clock).
RECONCILE_INTERVAL_S = 300.0
# Removals for these reasons count as evictions in the stats.
_EVICTION_REASONS = ("limit", "evict")


class Accounting:
    """What one cache directory holds and may hold. Methods named ``*_locked`` run under ``lock``; the
    others take it themselves (CacheTimeout if it is not free in time, OSError for disk trouble)."""

    def __init__(self, disk: DiskStore, config: CacheConfig, memory: MemoryTier, stats: StatsStore,
                 clock: Callable[[], float]):
        self.disk, self.memory, self.stats, self.clock = disk, memory, stats, clock
        self.limit = config.limit_bytes
        self.policy = config.policy
        self.lock = DirLock(disk.root / "eviction.lock", config.lock_timeout_s)
        self.ledger = LedgerFile(disk.root / "size.json")
        self.evictions = EvictionLog(disk.root / EVICTIONS_LOG, self.limit)

    def maintain(self) -> None:
        """Sweep temp files of killed writers and confirm the ledger when it is missing or old."""
        self.disk.sweep_temps()
        if self._stale(self.ledger.read()):
            with self.lock.hold():
                self.reconcile_locked()

    def clear_on_start(self) -> None:
        """delete_on_start: clear the directory unless a process of this launch has cleared it already."""
        startup.claim_launch()
        marker, launch = self.disk.root / "clear.marker", startup.launch_id()
        with self.lock.hold():
            if startup.should_clear(startup.read_marker(marker), launch):
                self.clear_locked("delete_on_start")
                startup.write_marker(marker, launch)

    def _stale(self, ledger: Ledger | None) -> bool:
        return ledger is None or self.clock() - ledger.reconciled > RECONCILE_INTERVAL_S

    def ledger_now(self) -> Ledger:
        """The shared ledger, or a count from a scan if there is none (nothing is written)."""
        ledger = self.ledger.read()
        if ledger is None:
            items = self.disk.scan()
            ledger = Ledger(sum(i.size for i in items), len(items), 0.0)
        return ledger

    # -- publishing ---------------------------------------------------------------------------------------

    def publish(self, tmp, key: str, size: int) -> bool:
        """Publish the temp file ``tmp`` as the entry under key; False if another process did first."""
        with self.lock.hold():
            return self._publish_locked(tmp, key, size)

    def _publish_locked(self, tmp, key: str, size: int) -> bool:
        """Count the entry, then publish it, then trim if over the limit.

        Counting first means a writer killed in between leaves the ledger over, never under, the real total, so
        the real total never exceeds a ledger that says we are within the limit."""
        ledger = self.ledger.read()
        if self._stale(ledger):
            self.disk.sweep_temps()  # long-running processes sweep killed writers' leftovers here too
            ledger = self.reconcile_locked()
        self.ledger.write(ledger.add(size))
        if not self.disk.publish(tmp, key):
            self.ledger.write(ledger)  # another process published it first
            return False
        if self.limit is not None and ledger.directory_bytes + size > self.limit:
            self.reconcile_locked()
        return True

    # -- counting and trimming ------------------------------------------------------------------------------

    def reconcile_locked(self) -> Ledger:
        """Recount the directory, trim it to TRIM_RATIO of the limit if it is over (bookkeeping files,
        manifests and the quarantine count against the limit too), and record the result."""
        items = self.disk.scan()
        total = sum(item.size for item in items)
        overhead = self.disk.overhead_bytes()
        removed = []
        if self.limit is not None and total + overhead > self.limit:
            target = max(0, int(self.limit * TRIM_RATIO) - overhead)
            removed = plan_trim(self._candidates(items), self.policy, target)
            total = self.remove_locked(removed, total, "limit")
        ledger = Ledger(total, len(items) - len(removed), self.clock(), overhead)
        self.ledger.write(ledger)
        return ledger

    def _candidates(self, items: list[FileItem]) -> list[Candidate]:
        if self.policy == "created":  # creation time lives in the header
            return [Candidate(info.key, info.size, info.created, info.last_used)
                    for info, _ in self.infos(items, headers=True)]
        return [Candidate(item.key, item.size, item.mtime, item.mtime) for item in items]

    def remove_locked(self, victims: list, total: int, reason: str) -> int:
        """Remove victims, logging each before its file goes; returns the total left."""
        for victim in victims:
            self.evictions.append(victim.key, victim.size, reason)
            self.memory.pop(victim.key)
            if not discard(self.disk.entry_path(victim.key)):
                continue
            total -= victim.size
            if reason in _EVICTION_REASONS:
                log_removal(victim.key, total)
                self.stats.add(evictions=1, bytes_evicted=victim.size)
        return total

    def adjust_locked(self, size: int, entries: int) -> None:
        ledger = self.ledger.read()
        if ledger is None:
            self.reconcile_locked()
        else:
            self.ledger.write(ledger.add(size, entries))

    def clear_locked(self, reason: str) -> None:
        items = self.disk.scan()
        for item in items:
            self.evictions.append(item.key, item.size, reason)
            discard(item.path)
        self.ledger.write(Ledger(0, 0, self.clock()))
        logger.info("recipe cache at %s: %s removed %d entries", self.disk.root, reason, len(items))

    def infos(self, items: list[FileItem], headers: bool) -> list[tuple[EntryInfo, bool]]:
        """EntryInfo per file and whether its header read cleanly (bad files sort as created at 0)."""
        return [self._info(item, headers) for item in items]

    def _info(self, item: FileItem, headers: bool) -> tuple[EntryInfo, bool]:
        if not headers:
            return EntryInfo(item.key, item.size, item.mtime, item.mtime), True
        try:
            header = self.disk.read_header(item.path)
        except (OSError, CorruptEntry):
            return EntryInfo(item.key, item.size, 0.0, item.mtime), False
        ok = header.key == item.key
        return EntryInfo(item.key, item.size, header.created if ok else 0.0, item.mtime, 0, header.meta), ok

    # -- unusable entries --------------------------------------------------------------------------------

    def quarantine_if_same(self, key: str, payload: bytes) -> None:
        """Set aside the entry under key unless a fresh entry with another payload replaced it."""
        with self.lock.hold():
            result = self.disk.read(key)
            if result is None:
                return
            try:
                if decode_entry(result.data).payload != payload:
                    return  # replaced by a fresh entry since it was read
            except (CorruptEntry, VersionMismatch):
                pass  # unreadable on disk as well: set it aside all the same
            if self.disk.quarantine(self.disk.entry_path(key)):
                self.reconcile_locked()

    def discard(self, key: str, ident: tuple, quarantine: bool) -> None:
        """Quarantine (damaged) or delete (another format) the file under key if it is still the one read."""
        path = self.disk.entry_path(key)
        with self.lock.hold():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return
            if identity(st) != ident:
                return  # replaced by a fresh entry since we read the bad one
            if quarantine and self.disk.quarantine(path):
                self.reconcile_locked()  # rare, and a damaged file's size says nothing about what was counted
            elif not quarantine and discard(path):
                self.adjust_locked(-st.st_size, -1)  # an intact old-format file: common after an upgrade
