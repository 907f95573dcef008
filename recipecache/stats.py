"""Per-directory statistics: counters batched in memory, merged into stats.json under a lock when flushed."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

from .locks import DirLock
from .safeio import append, read_small, write_atomic

COUNTERS = ("hits", "disk_hits", "remote_hits", "misses", "corrupt", "evictions", "bytes_written", "bytes_evicted",
            "compile_time_saved_s")
# Counters gathered by reads are handed to the background writer at most this often.
STATS_FLUSH_S = 5.0
# Per-key hit counts go to an append-only log; compact it when it grows past this.
_HITS_COMPACT_BYTES = 1024 * 1024


class StatsStore:
    """Counters for one cache directory (stats.json) and per-entry hit counts (hits.log)."""

    def __init__(self, root: Path, lock_timeout_s: float):
        self.file = root / "stats.json"
        self.hits_file = root / "hits.log"
        self._lock = DirLock(root / "stats.lock", lock_timeout_s)
        self._mutex = threading.Lock()  # the pending counts (held briefly: hits take it)
        # a flush in progress (readers wait, so nothing is counted twice or not at all)
        self._flushing = threading.Lock()
        self._pending: Counter = Counter()
        self._pending_hits: Counter = Counter()
        self.last_flush = time.monotonic()

    def add(self, **deltas) -> None:
        with self._mutex:
            self._pending.update(deltas)

    def hit(self, key: str, **deltas) -> None:
        with self._mutex:
            self._pending.update(hits=1, **deltas)
            self._pending_hits[key] += 1

    @property
    def dirty(self) -> bool:
        return bool(self._pending or self._pending_hits)

    def due(self) -> bool:
        """True (once) when counts are pending and the last flush is older than STATS_FLUSH_S."""
        if self.dirty and time.monotonic() - self.last_flush > STATS_FLUSH_S:
            self.last_flush = time.monotonic()
            return True
        return False

    def flush(self) -> None:
        """Merge pending counts into the files (OSError/CacheTimeout propagate; the counts are kept)."""
        with self._flushing:
            with self._mutex:
                pending, hits = self._pending, self._pending_hits
                self._pending, self._pending_hits = Counter(), Counter()
            try:
                self._merge(pending, hits)
            except BaseException:
                with self._mutex:  # put them back so a later flush can try again
                    self._pending.update(pending)
                    self._pending_hits.update(hits)
                raise
        self.last_flush = time.monotonic()

    def _merge(self, pending: Counter, hits: Counter) -> None:
        if not pending and not hits:
            return
        with self._lock.hold():
            if pending:
                totals = self._read_totals()
                totals.update(pending)
                write_atomic(self.file, json.dumps(dict(totals)).encode())
            if hits:
                size = append(self.hits_file, "".join(f"{k} {n}\n" for k, n in hits.items()).encode())
                self._compact_if_large(size)

    def _read_totals(self) -> Counter:
        try:
            data = json.loads(read_small(self.file))
        except (OSError, ValueError):
            return Counter()
        if not isinstance(data, dict):
            return Counter()
        return Counter({k: v for k, v in data.items() if k in COUNTERS and isinstance(v, (int, float))})

    def counters(self) -> dict:
        """Persisted plus not-yet-flushed counters."""
        with self._flushing:
            totals = self._read_totals()
            with self._mutex:
                totals.update(self._pending)
        return {name: totals.get(name, 0) for name in COUNTERS}

    def key_hits(self) -> Counter:
        """Hits per key, persisted plus pending."""
        with self._flushing:
            counts = _read_hits(self.hits_file)
            with self._mutex:
                counts.update(self._pending_hits)
        return counts

    def reset(self) -> None:
        with self._mutex:
            self._pending.clear()
            self._pending_hits.clear()
        with self._lock.hold():
            write_atomic(self.file, b"{}")
            write_atomic(self.hits_file, b"")

    def _compact_if_large(self, size: int) -> None:
        if size > _HITS_COMPACT_BYTES:
            counts = _read_hits(self.hits_file)
            write_atomic(self.hits_file, "".join(f"{k} {n}\n" for k, n in counts.items()).encode())

    def clear_hits(self) -> None:
        """Forget per-key hit counts (the entries they counted are gone)."""
        with self._mutex:
            self._pending_hits.clear()
        with self._lock.hold():
            write_atomic(self.hits_file, b"")


def _read_hits(path: Path) -> Counter:
    counts: Counter = Counter()
    try:
        lines = read_small(path).decode(errors="replace").splitlines()
    except OSError:  # missing, or not a regular file: no counts
        return counts
    for parts in map(str.split, lines):
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] += int(parts[1])
    return counts
