"""The disk tier's writes: entries queued for the background writer, stored write-once, and the switch to
memory only when the disk fails (a full, read-only or vanished disk never fails a caller)."""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path

from .accounting import Accounting
from .disk import discard
from .entry import Entry, encode_entry
from .errors import CacheTimeout
from .remote import RemoteTier
from .writer import BackgroundWriter

logger = logging.getLogger("recipecache")


class Persister:
    """Writes entries to ``space.disk`` (and then to ``remote``, if any) on one background thread; entries
    queued and not yet on disk stay readable through ``pending``."""

    def __init__(self, space: Accounting, remote: RemoteTier | None, path: Path):
        self.space, self.disk, self.remote, self.path = space, space.disk, remote, path
        self.degraded: str | None = None  # why the disk tier was switched off
        self._pending: dict[str, Entry] = {}
        self._mutex = threading.Lock()
        self.writer = BackgroundWriter("recipecache-writer", on_idle=self.flush_stats)

    def pending(self, key: str) -> Entry | None:
        with self._mutex:
            return self._pending.get(key)

    def forget(self, key: str, payload: bytes) -> None:
        """Drop a queued entry that holds ``payload`` (its reader found it unusable)."""
        with self._mutex:
            pending = self._pending.get(key)
            if pending is not None and pending.payload == payload:
                del self._pending[key]

    def enqueue(self, entry: Entry, push: bool = True) -> bool:
        """Queue entry for the disk (and the fleet, with push); False if the disk is off or it is queued."""
        with self._mutex:
            if self.degraded is not None or entry.key in self._pending:
                return False
            self._pending[entry.key] = entry
        self.writer.submit(partial(self._write_job, entry, push and self.remote is not None))
        return True

    def submit(self, job, *args) -> None:
        """Run ``job(*args)`` on the writer thread, as a disk job (nothing while the disk is off)."""
        if self.degraded is None:
            self.writer.submit(partial(self.run, partial(job, *args)))

    def _write_job(self, entry: Entry, push: bool = False) -> None:
        data = encode_entry(entry.key, entry.payload, entry.meta, entry.created)  # the same bytes for both tiers
        try:
            self.run(partial(self._store, entry, data))
        finally:
            with self._mutex:
                self._pending.pop(entry.key, None)
        if push:  # local first, then the fleet
            self.remote.put(entry.key, data)

    def _store(self, entry: Entry, data: bytes) -> None:
        if self.degraded is not None or self.disk.exists(entry.key):
            return
        limit = self.space.limit
        if limit is not None and len(data) > limit:
            logger.warning("recipe cache: entry %s (%d bytes) is larger than the cache limit (%d bytes); "
                           "not stored on disk", entry.key, len(data), limit)
            return
        tmp = self.disk.write_temp(entry.key, data, entry.created)
        try:
            published = self.space.publish(tmp, entry.key, len(data))
        finally:
            discard(tmp)
        if published:
            self.space.stats.add(bytes_written=len(data))

    def run(self, job) -> None:
        """Run a disk job; disk trouble degrades the tier, a lock timeout skips the job."""
        try:
            job()
        except CacheTimeout as exc:
            logger.warning("recipe cache: skipped a background write: %s", exc)
        except OSError as exc:
            self.degrade(exc)

    def degrade(self, exc: OSError) -> None:
        with self._mutex:
            if self.degraded is not None:
                return
            self.degraded = str(exc)
        logger.warning("recipe cache at %s: disk tier disabled (%s); continuing with the in-memory tier only",
                       self.path, exc)

    def flush(self) -> None:
        """Wait for pending writes, then persist the batched stats."""
        self.writer.drain()
        self.flush_stats()

    def flush_stats(self) -> None:
        if self.degraded is None and self.space.stats.dirty:
            self.run(self.space.stats.flush)

    def schedule_stats(self) -> None:
        """Reads only count in memory; hand a flush to the writer now and then so other processes see them."""
        if self.space.stats.due():
            self.writer.submit(self.flush_stats)
