"""The fleet tier: entries shared across hosts through Redis (redis-py), behind memory and the local disk.

An entry is stored under ``<namespace>:<key>`` as the exact bytes of its file on disk (header,
payload, checksum), with a time to live. Any Redis trouble (server down, timeout, auth, a reset
mid-transfer) costs one warning and a short, bounded wait; the tier then stays off for
``RETRY_AFTER_S`` before it is tried again, so a process keeps compiling with its local tiers and
never waits on every call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .errors import ConfigError

logger = logging.getLogger("recipecache")

PREFIX = "hpu_recipes"
TIMEOUT_S = 0.25
RETRY_AFTER_S = 30.0


class RemoteTier:
    """Get, put and delete entry bytes in one Redis database (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str, ttl_s: float, namespace: str = "", clock: Callable[[], float] = time.monotonic):
        try:
            import redis
        except ImportError:
            raise ConfigError(f"remote cache {url}: the redis client is not installed; "
                              "pip install 'hpu_backend[fleet]'") from None
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                                                retry_on_timeout=False)
        except ValueError as e:
            raise ConfigError(f"remote cache URL {url!r}: {e}") from None
        self._errors = (redis.RedisError, OSError)
        self.url = url
        self.ttl_s = ttl_s
        self.prefix = f"{PREFIX}:{namespace}:" if namespace else f"{PREFIX}:"
        self._clock = clock
        self._down_until = 0.0
        self._mutex = threading.Lock()

    def name(self, key: str) -> str:
        return self.prefix + key

    @property
    def available(self) -> bool:
        return self._clock() >= self._down_until

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: self._client.get(self.name(key)))

    def put(self, key: str, data: bytes) -> bool:
        """Store unless present (first writer wins, like the disk tier); True if the call went through."""
        ttl = max(1, int(self.ttl_s))
        return self._call(lambda: self._client.set(self.name(key), data, ex=ttl, nx=True) or True) is not None

    def put_doc(self, name: str, data: bytes) -> bool:
        """Store (replace) a small document beside the entries, e.g. a manifest; True if it went through."""
        ttl = max(1, int(self.ttl_s))
        return self._call(lambda: self._client.set(f"{self.prefix}doc:{name}", data, ex=ttl) or True) is not None

    def get_doc(self, name: str) -> bytes | None:
        return self._call(lambda: self._client.get(f"{self.prefix}doc:{name}"))

    def delete(self, key: str) -> None:
        self._call(lambda: self._client.delete(self.name(key)))

    def stats(self) -> dict:
        """Entries and bytes under this tier's prefix (a SCAN: for the CLI, not for serving)."""
        def count():
            entries = size = 0
            for name in self._client.scan_iter(match=self.prefix + "*", count=1000):
                if name.startswith((self.prefix + "doc:").encode()):
                    continue
                entries += 1
                size += self._client.strlen(name)
            return {"entries": entries, "bytes": size}
        return self._call(count, raise_errors=True)

    def _call(self, fn, raise_errors: bool = False):
        if not self.available and not raise_errors:
            return None
        try:
            return fn()
        except self._errors as exc:
            if raise_errors:
                raise ConnectionError(f"remote cache {self.url}: {exc}") from None
            with self._mutex:
                first = self.available
                self._down_until = self._clock() + RETRY_AFTER_S
            if first:
                logger.warning("recipe cache: remote tier %s unavailable (%s); using the local tiers, retrying in "
                               "%.0f s", self.url, exc, RETRY_AFTER_S)
            return None
