"""Inter-process locks on files in the cache directory (filelock, bounded wait)."""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import CacheTimeout
from .safeio import open_regular

# filelock polls a non-blocking flock; its 50 ms default would serialize busy writers badly.
_POLL_S = 0.001


class DirLock:
    """An exclusive lock on one file in a directory that must already exist."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self._lock, self._pid = FileLock(str(path), mode=0o600), os.getpid()

    @contextmanager
    def hold(self):
        """Hold the lock; CacheTimeout after timeout_s, FileNotFoundError if the directory vanished."""
        # filelock would recreate a deleted cache directory with default permissions; refuse instead.
        if not self.path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "cache directory vanished", str(self.path.parent))
        # filelock opens its file with O_TRUNC, following links: make sure a regular file with no other name
        # (no hard link from outside the cache) is there first; anything else is refused (OSError).
        os.close(open_regular(self.path, os.O_RDONLY | os.O_CREAT, one_name=True))
        if self._pid != os.getpid():  # a forked child (a DataLoader worker): its own lock, not the parent's
            self._lock, self._pid = FileLock(str(self.path), mode=0o600), os.getpid()
        try:
            self._lock.acquire(timeout=self.timeout_s, poll_interval=_POLL_S)
        except Timeout:
            raise CacheTimeout(f"could not lock {self.path} within {self.timeout_s} s") from None
        try:
            yield
        finally:
            self._lock.release()

