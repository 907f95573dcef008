"""Eviction policies and plans, and the append-only evictions.log that accounts for every removal."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

from .entry import EntryInfo
from .safeio import append, read_small

logger = logging.getLogger("recipecache")

# Cleanup trims below the limit so that it does not run again on the very next store.
TRIM_RATIO = 0.99
EVICTIONS_LOG = "evictions.log"  # in the cache directory
_LOG_ROTATE_BYTES = 8 * 1024 * 1024


class Candidate(NamedTuple):
    """What automatic trimming needs of an entry (a tuple: a trim looks at every entry)."""

    key: str
    size: int
    created: float
    last_used: float


def policy_order(items: list[EntryInfo], policy: str) -> list[EntryInfo]:
    """Items in eviction order: least recently used first (lru) or oldest created first (created)."""
    if policy == "created":
        return sorted(items, key=lambda i: (i.created, i.last_used, i.key))
    return sorted(items, key=lambda i: (i.last_used, i.created, i.key))


def plan_trim(items: list[EntryInfo], policy: str, target: int) -> list[EntryInfo]:
    """The shortest prefix of the eviction order that brings the total down to target bytes."""
    total = sum(i.size for i in items)
    victims = []
    for item in policy_order(items, policy):
        if total <= target:
            break
        victims.append(item)
        total -= item.size
    return victims


def select(items: list[EntryInfo], policy: str, now: float, older_than_s=None, max_bytes=None, keys=None,
           predicate=None) -> list[EntryInfo]:
    """Victims matching every given filter; with max_bytes, only as many as needed to fit max_bytes."""
    wanted = set(keys) if keys is not None else None
    candidates = [i for i in items
                  if (wanted is None or i.key in wanted)
                  and (older_than_s is None or now - i.last_used > older_than_s)
                  and (predicate is None or predicate(i))]
    if max_bytes is None:
        return policy_order(candidates, policy)
    kept = sum(i.size for i in items) - sum(i.size for i in candidates)
    return plan_trim(candidates, policy, max(0, max_bytes - kept))


class EvictionLog:
    """evictions.log: one line per removed entry, written before the file goes (one write, O_APPEND)."""

    def __init__(self, path: Path, limit: int | None = None):
        self.path = path
        # The log and its rotated predecessor stay a small part of a bounded cache.
        self.rotate_bytes = _LOG_ROTATE_BYTES if not limit else max(4096, min(_LOG_ROTATE_BYTES, limit // 64))

    def append(self, key: str, size: int, reason: str) -> None:
        line = f"{time.time():.6f} {os.getpid()} {reason} {key} {size}\n".encode()
        if append(self.path, line) > self.rotate_bytes:  # callers hold the cache lock, so only one process rotates
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))

    def keys(self) -> set[str]:
        """Every key the log (and its rotated predecessor) records as removed."""
        return set(self.sizes())

    def sizes(self) -> dict[str, int]:
        """Each removed key's size in bytes, as the log (and its rotated predecessor) records it."""
        return {key: record.size for key, record in self.records().items()}

    def records(self) -> dict[str, "Removal"]:
        """The last removal the log (and its rotated predecessor) records for each key."""
        found: dict[str, Removal] = {}
        for path in (self.path.with_name(self.path.name + ".1"), self.path):
            try:
                lines = read_small(path).decode(errors="replace").splitlines()
            except OSError:  # missing, or not a regular file
                continue
            found.update((parts[3], Removal(int(parts[4]), parts[2], int(parts[1])))
                         for parts in map(str.split, lines)
                         if len(parts) == 5 and parts[4].isdigit() and parts[1].isdigit())
        return found


class Removal(NamedTuple):
    """One line of evictions.log: the entry's size, why it went (``limit``: trimmed to stay under the size
    limit; ``evict``, ``remove``, ``clear``, ``delete_on_start``: asked for) and the process that removed it."""

    size: int
    reason: str
    pid: int


def log_removal(key: str, remaining: int) -> None:
    logger.info("Removed %s successfully. Disk cache size after removal: %s", key, remaining)
