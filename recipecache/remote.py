"""The fleet tier: entries shared across hosts through Redis (redis-py), behind memory and the local disk.

An entry is stored under ``<namespace>:<key>`` as the exact bytes of its file on disk (header,
payload, checksum), with a time to live. With a team key (``HPURECIPE_BUNDLE_KEY``, see signing.py),
each value is sealed: ``SEAL`` + the HMAC-SHA256 of its Redis name and bytes + the bytes; a host with
the key takes only values sealed with it (anything else is a miss, one warning, and is deleted so that
a signed entry can take its place). A host without a key checks no seal and trusts the namespace.

The server is not trusted to behave either: each operation has a total deadline (not a per-read
timeout); every length in a reply is checked before anything is allocated (a string may not exceed
``MAX_REPLY`` bytes, an array ``MAX_ITEMS`` elements); GET must answer a string or nothing; and
anything redis-py raises, whatever its type, costs one warning and a short, bounded wait; the tier
then stays off for ``RETRY_AFTER_S`` before it is tried again, so a process keeps compiling with its
local tiers and never waits on every call. One value over ``MAX_REPLY`` is not a server fault: it is
a miss, and it is deleted (no host could ever read it), so it cannot block every host's pull.
Warnings show the URL without its password and the server's text with control characters escaped.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from typing import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import ConfigError
from .signing import TAG_BYTES, sign, signing_key, verify
from .errors import HpuBackendError

logger = logging.getLogger("recipecache")

PREFIX = "hpu_recipes"
TIMEOUT_S = 0.25  # one socket read or connect
DEADLINE_S = 1.0  # one whole operation, however the server drips its reply
ADMIN_DEADLINE_S = 60.0  # a SCAN for the CLI's stats
RETRY_AFTER_S = 30.0
MAX_REPLY = 64 * 1024 * 1024  # one reply (an entry is KBs to a few MB; a bundle member is capped alike)
MAX_ITEMS = 1 << 20  # elements of one array or map reply (a SCAN page asks for 1000)
SEAL = b"HPRS"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadReply(HpuBackendError):
    """The server answered a command with a reply of the wrong type (e.g. a number to GET)."""


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
        return self._opened(name, self._call(lambda: self._value(name)), delete=True)

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
        return self._opened(full, self._call(lambda: self._value(full)), delete=False)

    def delete(self, key: str) -> None:
        self._call(lambda: self._client.delete(self.name(key)))

    def delete_if(self, key: str, unusable: Callable[[bytes], bool]) -> bool:
        """Delete the entry under key if ``unusable(its bytes)``, unless another host replaced it meanwhile
        (compare and delete in one server-side step); True if it was deleted."""
        name = self.name(key)
        raw = self._call(lambda: self._value(name))
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

    def _value(self, name: str) -> bytes | None:
        """GET ``name``: its bytes, or None. A value no host could read (over MAX_REPLY bytes, refused before
        it is read; or not a string) is deleted, unless replaced meanwhile by a good one: a bad value is one
        miss, not a server fault. Any reply but a string or nothing is BadReply."""
        from redis.exceptions import ResponseError

        try:
            value = self._client.get(name)
        except _oversized_value() as exc:  # the connection is closed: the rest of the value is never read
            self._client.eval(_DELETE_IF_LONGER, 1, name, MAX_REPLY)
            self._report(name, f"{exc}; deleted")
            return None
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            self._client.eval(_DELETE_IF_NOT_STRING, 1, name)
            self._report(name, "not a string (a list, set or hash in its place); deleted")
            return None
        if value is not None and not isinstance(value, bytes):
            raise BadReply(f"GET answered {clean(type(value).__name__)}, not a string")
        return value

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
        self._report(name, f"{why}, and a signing key is set")

    def _report(self, name: str, why: str) -> None:
        """One warning per process for an entry the tier will not serve (the rest at debug level)."""
        with self._mutex:
            first, self._refused_once = not self._refused_once, True
        log = logger.warning if first else logger.debug
        log("recipe cache: refusing remote entry %s from %s: %s; treated as a miss%s",
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
# Delete KEYS[1] only if it is still something other than a string (a list, set, hash...).
_DELETE_IF_NOT_STRING = ("local t = redis.call('TYPE', KEYS[1]).ok if t ~= 'string' and t ~= 'none' then "
                         "return redis.call('DEL', KEYS[1]) end return 0")
# Delete KEYS[1] only if it is still a string longer than ARGV[1] bytes (one no host can read).
_DELETE_IF_LONGER = ("if redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('STRLEN', KEYS[1]) > "
                     "tonumber(ARGV[1]) then return redis.call('DEL', KEYS[1]) end return 0")


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


@functools.cache
def _oversized_value() -> type:
    """OversizedValue: a redis-py InvalidResponse (so the client closes the connection it came on), made on
    first use because this module must import without redis-py."""
    from redis.exceptions import InvalidResponse

    class OversizedValue(InvalidResponse):
        """A string reply longer than MAX_REPLY bytes, refused before it is read."""

    return OversizedValue


# The RESP types whose line announces a length in bytes, or a count of elements.
_LENGTHS = {b"$": "bytes", b"=": "bytes", b"!": "bytes", b"*": "elements", b"%": "elements", b"~": "elements",
            b">": "elements", b"|": "elements"}


def _check_line(line: bytes, oversized: type, invalid: type) -> None:
    """Refuse a length or count line announcing more than its limit (or a malformed one), before the parser
    allocates for it: a forged 4 GB string or a 10^15-element array costs nothing."""
    unit = _LENGTHS.get(line[:1])
    if unit is None:
        return
    digits = line[2:] if line[1:2] == b"-" else line[1:]
    if len(line) > 24 or not digits.isdigit():
        raise invalid(f"a malformed reply length {clean(line[:40])}")
    n, limit = int(line[1:]), MAX_REPLY if unit == "bytes" else MAX_ITEMS
    if n > limit:
        error = oversized if line[:1] == b"$" else invalid
        raise error(f"a reply of {n} {unit}, over the {limit}-{unit[:-1]} limit")
    if n < -1:
        raise invalid(f"a reply of {n} {unit}")


def _capped_parser(url: str):
    """redis-py's pure-Python parser for the URL's protocol, checking every length and count a reply
    announces before it is read (see _check_line)."""
    from redis._parsers import _RESP2Parser, _RESP3Parser
    from redis._parsers.socket import SENTINEL, SocketBuffer
    from redis.exceptions import InvalidResponse

    oversized = _oversized_value()

    class CappedBuffer(SocketBuffer):
        lines = 0  # read since the last complete reply: nested arrays, each within MAX_ITEMS, stay bounded too

        def readline(self, timeout=SENTINEL) -> bytes:
            line = super().readline(timeout)
            self.lines += 1
            if self.lines > MAX_ITEMS:
                raise InvalidResponse(f"a reply of more than {MAX_ITEMS} elements")
            _check_line(line, oversized, InvalidResponse)
            return line

        def purge(self) -> None:  # a reply was read whole
            self.lines = 0
            super().purge()

        def rewind(self, pos: int) -> None:  # it will be read again
            self.lines = 0
            super().rewind(pos)

        def read(self, length: int, timeout=SENTINEL) -> bytes:
            if length > MAX_REPLY:
                raise oversized(f"a reply of {length} bytes, over the {MAX_REPLY}-byte limit")
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
