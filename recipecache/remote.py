"""The fleet tier: entries shared across hosts through Redis (redis-py), behind memory and the local disk.

An entry is stored under ``<namespace>:<key>`` as the exact bytes of its file on disk (header,
payload, checksum), with a time to live. With a team key (``HPURECIPE_BUNDLE_KEY``, see signing.py),
each value is sealed: ``SEAL`` + the HMAC-SHA256 of its Redis name and bytes + the bytes; a host with
the key takes only values sealed with it (anything else is a miss, one warning, and is deleted so that
a signed entry can take its place). A host without a key checks no seal and trusts the namespace.

The server is not trusted to behave either: each operation has a total deadline (not a per-read
timeout), a reply may not exceed ``MAX_REPLY`` bytes, and anything redis-py raises, whatever its
type, costs one warning and a short, bounded wait; the tier then stays off for ``RETRY_AFTER_S``
before it is tried again, so a process keeps compiling with its local tiers and never waits on every
call. Warnings show the URL without its password and the server's text with control characters escaped.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import ConfigError
from .signing import TAG_BYTES, sign, signing_key, verify

logger = logging.getLogger("recipecache")

PREFIX = "hpu_recipes"
TIMEOUT_S = 0.25  # one socket read or connect
DEADLINE_S = 1.0  # one whole operation, however the server drips its reply
ADMIN_DEADLINE_S = 60.0  # a SCAN for the CLI's stats
RETRY_AFTER_S = 30.0
MAX_REPLY = 64 * 1024 * 1024  # one reply (an entry is KBs to a few MB; a bundle member is capped alike)
SEAL = b"HPRS"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class RemoteTier:
    """Get, put and delete entry bytes in one Redis database (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str, ttl_s: float, namespace: str = "", clock: Callable[[], float] = time.monotonic,
                 key: bytes | None = None):
        """``key``: the team key to seal and check values with (default: the environment's, if set)."""
        self.url = redact_url(url)
        try:
            import redis
        except ImportError:
            raise ConfigError(f"remote cache {self.url}: the redis client is not installed; "
                              "pip install 'hpu_backend[fleet]'") from None
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                                                retry_on_timeout=False, parser_class=_capped_parser(url))
        except ValueError as e:
            raise ConfigError(f"remote cache URL {self.url!r}: {clean(e)}") from None
        self.ttl_s = ttl_s
        self.prefix = f"{PREFIX}:{namespace}:" if namespace else f"{PREFIX}:"
        self._key = signing_key() if key is None else key
        self._clock = clock
        self._down_until = 0.0
        self._refused_once = False
        self._mutex = threading.Lock()

    def name(self, key: str) -> str:
        return self.prefix + key

    @property
    def available(self) -> bool:
        return self._clock() >= self._down_until

    @property
    def signed(self) -> bool:
        """Whether values are sealed and checked (a team key is set)."""
        return self._key is not None

    def get(self, key: str) -> bytes | None:
        """The entry bytes under key, or None (absent, the tier is down, or refused: unsigned or forged)."""
        name = self.name(key)
        return self._opened(name, self._call(lambda: self._client.get(name)), delete=True)

    def put(self, key: str, data: bytes) -> bool:
        """Store unless present (first writer wins, like the disk tier); True if the call went through."""
        name, ttl = self.name(key), max(1, int(self.ttl_s))
        value = self._sealed(name, data)
        return self._call(lambda: self._client.set(name, value, ex=ttl, nx=True) or True) is not None

    def put_doc(self, name: str, data: bytes) -> bool:
        """Store (replace) a small document beside the entries, e.g. a manifest; True if it went through."""
        full, ttl = f"{self.prefix}doc:{name}", max(1, int(self.ttl_s))
        value = self._sealed(full, data)
        return self._call(lambda: self._client.set(full, value, ex=ttl) or True) is not None

    def get_doc(self, name: str) -> bytes | None:
        full = f"{self.prefix}doc:{name}"
        return self._opened(full, self._call(lambda: self._client.get(full)), delete=False)

    def delete(self, key: str) -> None:
        self._call(lambda: self._client.delete(self.name(key)))

    def delete_if(self, key: str, unusable: Callable[[bytes], bool]) -> bool:
        """Delete the entry under key if ``unusable(its bytes)``, unless another host replaced it meanwhile
        (compare and delete in one server-side step); True if it was deleted."""
        name = self.name(key)
        raw = self._call(lambda: self._client.get(name))
        data = self._opened(name, raw, delete=False) if raw is not None else None
        if raw is None or (data is not None and not unusable(data)):
            return False
        return bool(self._call(lambda: self._client.eval(_COMPARE_AND_DELETE, 1, name, raw)))

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
        return self._call(count, raise_errors=True, deadline_s=ADMIN_DEADLINE_S)

    # -- sealing -------------------------------------------------------------------------------------------

    def _sealed(self, name: str, data: bytes) -> bytes:
        if self._key is None:
            return data
        return SEAL + sign(self._key, (name.encode(), data)) + data

    def _opened(self, name: str, value, delete: bool) -> bytes | None:
        """The bytes inside a stored value, or None if a key is set and the value is not sealed with it
        (one warning per process; the entry is then deleted, with ``delete``)."""
        if value is None:
            return None
        value = bytes(value)
        sealed = value.startswith(SEAL) and len(value) >= len(SEAL) + TAG_BYTES
        data = value[len(SEAL) + TAG_BYTES:] if sealed else value
        if self._key is None:
            return data  # no key: nothing is checked (see the README's trust section)
        tag = value[len(SEAL):len(SEAL) + TAG_BYTES]
        if sealed and verify(self._key, (name.encode(), data), tag):
            return data
        self._refuse(name, "unsigned" if not sealed else "signed with another key, or changed after signing")
        if delete:
            self._call(lambda: self._client.eval(_COMPARE_AND_DELETE, 1, name, value))
        return None

    def _refuse(self, name: str, why: str) -> None:
        with self._mutex:
            first, self._refused_once = not self._refused_once, True
        log = logger.warning if first else logger.debug
        log("recipe cache: refusing remote entry %s from %s: %s, and a signing key is set; treated as a miss%s",
            clean(name), self.url, why, " (further refusals are not reported)" if first else "")

    # -- calling the server ----------------------------------------------------------------------------------

    def _call(self, fn, raise_errors: bool = False, deadline_s: float = DEADLINE_S):
        if not self.available and not raise_errors:
            return None
        try:
            return self._within(fn, deadline_s)
        except Exception as exc:  # redis-py's errors and whatever a hostile server provokes: never the caller's
            if raise_errors:
                raise ConnectionError(f"remote cache {self.url}: {describe(exc)}") from None
            with self._mutex:
                first = self.available
                self._down_until = self._clock() + RETRY_AFTER_S
            if first:
                logger.warning("recipe cache: remote tier %s unavailable (%s); using the local tiers, retrying in "
                               "%.0f s", self.url, describe(exc), RETRY_AFTER_S)
            return None

    def _within(self, fn, deadline_s: float):
        """fn() on a helper thread, given up after ``deadline_s`` (its connections are then closed, which
        ends the helper's blocked read): a server that drips its reply cannot stall the caller."""
        box: dict = {}

        def run():
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        helper = threading.Thread(target=run, name="recipecache-remote", daemon=True)
        helper.start()
        helper.join(deadline_s)
        if helper.is_alive():
            self._client.connection_pool.disconnect()
            raise TimeoutError(f"no complete reply within {deadline_s:g} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")


# Delete KEYS[1] only if it still holds ARGV[1]: a host replacing a bad entry never deletes a good one.
_COMPARE_AND_DELETE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def redact_url(url: str) -> str:
    """The URL without its password (in the authority or a ``password=`` query field)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:  # user:password@host, :password@host, or password@host
            auth, host = netloc.rsplit("@", 1)
            user = auth.split(":", 1)[0] if ":" in auth else ""
            netloc = f"{user}:***@{host}"
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query)], safe="*")
        return clean(urlunsplit(parts._replace(netloc=netloc, query=query)))
    except ValueError:
        return "<unparsable URL>"


def clean(text: object, limit: int = 300) -> str:
    """Text from a server or a library, fit for a terminal: one line, control characters escaped, bounded."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return text if len(text) <= limit else text[:limit] + "..."


def describe(exc: BaseException) -> str:
    """``clean`` text naming an exception from the client (its type, when the message does not say it)."""
    message = clean(exc)
    expected = isinstance(exc, OSError) or type(exc).__module__.split(".")[0] == "redis"
    return message if expected and message else f"{type(exc).__name__}: {message}".rstrip(": ")


def _capped_parser(url: str):
    """redis-py's pure-Python parser for the URL's protocol, refusing any reply over MAX_REPLY bytes before
    it is read (a forged 4 GB length costs nothing)."""
    from redis._parsers import _RESP2Parser, _RESP3Parser
    from redis._parsers.socket import SENTINEL, SocketBuffer
    from redis.exceptions import InvalidResponse

    class CappedBuffer(SocketBuffer):
        def read(self, length: int, timeout=SENTINEL) -> bytes:
            if length > MAX_REPLY:
                raise InvalidResponse(f"a reply of {length} bytes, over the {MAX_REPLY}-byte limit")
            return super().read(length, timeout)

        def _read_from_socket(self, length=None, timeout=SENTINEL, raise_on_timeout=True) -> bool:
            if self.unread_bytes() > MAX_REPLY:  # e.g. a line that never ends
                raise InvalidResponse(f"a reply over the {MAX_REPLY}-byte limit")
            return super()._read_from_socket(length, timeout, raise_on_timeout)

    def on_connect(self, connection):
        base.on_connect(self, connection)
        self._buffer = CappedBuffer(self._sock, self.socket_read_size, connection.socket_timeout)

    try:
        from redis.utils import DEFAULT_RESP_VERSION as default
    except ImportError:  # an older client: RESP2 by default
        default = 2
    protocol = dict(parse_qsl(urlsplit(url).query)).get("protocol", str(default))
    base = _RESP2Parser if protocol.strip() == "2" else _RESP3Parser
    return type("Capped" + base.__name__.lstrip("_"), (base,), {"on_connect": on_connect})
