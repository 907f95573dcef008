"""The in-process memory tier: a bounded, thread-safe LRU of decoded entries."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .entry import Entry


class MemoryTier:
    """Keeps the most recently used entries, with the cache-clock time each last refreshed disk recency."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[str, list] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[Entry, float] | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0], item[1]

    def put(self, entry: Entry, touched: float) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._items[entry.key] = [entry, touched]
            self._items.move_to_end(entry.key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def set_touched(self, key: str, touched: float) -> None:
        with self._lock:
            if key in self._items:
                self._items[key][1] = touched

    def pop(self, key: str) -> bool:
        with self._lock:
            return self._items.pop(key, None) is not None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
