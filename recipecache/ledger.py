"""The shared size counter: total bytes and entry count of a cache directory, changed only under the lock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .safeio import read_small, write_atomic


@dataclass(frozen=True)
class Ledger:
    """Bytes and entries on disk, and when a real scan last confirmed them (cache clock). ``overhead`` is
    what the directory holds besides entries (bookkeeping, manifests, quarantine), as of that scan: the
    size limit covers it too."""

    total: int
    count: int
    reconciled: float
    overhead: int = 0

    def add(self, size: int, entries: int = 1) -> "Ledger":
        return Ledger(max(0, self.total + size), max(0, self.count + entries), self.reconciled, self.overhead)

    @property
    def directory_bytes(self) -> int:
        return self.total + self.overhead


class LedgerFile:
    """size.json in the cache directory; a missing or garbled file simply calls for a scan."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> Ledger | None:
        try:
            fields = json.loads(read_small(self.path))
            return Ledger(int(fields["total"]), int(fields["count"]), float(fields["reconciled"]),
                          int(fields.get("overhead", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, ledger: Ledger) -> None:
        data = {"total": ledger.total, "count": ledger.count, "reconciled": ledger.reconciled,
                "overhead": ledger.overhead}
        write_atomic(self.path, json.dumps(data).encode())
