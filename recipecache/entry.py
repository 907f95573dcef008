"""The self-describing on-disk entry format: prefix, msgpack header, payload, checksum."""

from __future__ import annotations

import hashlib
import math
import re
import struct
from dataclasses import dataclass, field

import msgpack

from .errors import CorruptEntry, VersionMismatch

# Bump on any change to the layout below; entries of another version read as misses.
FORMAT_VERSION = 1
MAGIC = b"HPRC"
# magic, format version, flags (reserved, 0), header length, payload length
_PREFIX = struct.Struct("<4sHHIQ")
PREFIX_SIZE = _PREFIX.size
DIGEST_SIZE = 16
MAX_HEADER = 64 * 1024
MAX_KEY_LEN = 128
_MAX_META_DEPTH = 8
KEY_RE = re.compile(r"[0-9A-Za-z_-]{1,%d}" % MAX_KEY_LEN)
_MSGPACK_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException)


@dataclass(frozen=True)
class Entry:
    """One decoded entry."""

    key: str
    payload: bytes
    meta: dict = field(default_factory=dict)
    created: float = 0.0
    version: int = FORMAT_VERSION


@dataclass(frozen=True)
class EntryInfo:
    """What a listing knows about an entry without reading its payload."""

    key: str
    size: int
    created: float
    last_used: float
    hits: int = 0
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Header:
    """The decoded prefix and header of an entry file."""

    key: str
    created: float
    meta: dict
    header_len: int
    payload_len: int

    @property
    def total_size(self) -> int:
        return PREFIX_SIZE + self.header_len + self.payload_len + DIGEST_SIZE


def validate_key(key: object) -> str:
    """Return key if it is a short [0-9A-Za-z_-] string; ValueError otherwise (it becomes a file name)."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise ValueError(f"invalid cache key {key!r}: expected 1-{MAX_KEY_LEN} characters of [0-9A-Za-z_-]")
    return key


def _check_meta_value(value: object, depth: int) -> bool:
    if depth > _MAX_META_DEPTH:
        return False
    if value is None or isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return -2**63 <= value < 2**64  # what msgpack can carry
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple)):
        return all(_check_meta_value(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _check_meta_value(v, depth + 1) for k, v in value.items())
    return False


def validate_meta(meta: object) -> dict:
    """Return meta (None -> {}) if it is a small map of plain values; ValueError otherwise."""
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not _check_meta_value(meta, 0):
        raise ValueError("meta must be a dict with str keys and str/int/float/bool/None/list/dict values")
    return meta


def encode_entry(key: str, payload: bytes, meta: dict | None = None, created: float = 0.0) -> bytes:
    """Serialize one entry; ValueError for a bad key, meta or an oversized header."""
    validate_key(key)
    header = msgpack.packb({"key": key, "created": float(created), "meta": validate_meta(meta)}, use_bin_type=True)
    if len(header) > MAX_HEADER:
        raise ValueError(f"entry header is {len(header)} bytes; meta must keep it under {MAX_HEADER}")
    payload = bytes(payload)
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), len(payload)) + header
    digest = hashlib.blake2b(head, digest_size=DIGEST_SIZE)
    digest.update(payload)
    return b"".join((head, payload, digest.digest()))


def decode_prefix(data: bytes) -> tuple[int, int]:
    """Return (header_len, payload_len) from the fixed prefix; CorruptEntry/VersionMismatch if unusable."""
    if len(data) < PREFIX_SIZE:
        raise CorruptEntry(f"truncated prefix ({len(data)} bytes)")
    magic, version, flags, header_len, payload_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise VersionMismatch(f"format version {version}, expected {FORMAT_VERSION}")
    if flags != 0 or header_len > MAX_HEADER:
        raise CorruptEntry(f"bad prefix (flags {flags}, header length {header_len})")
    return header_len, payload_len


def decode_header(data: bytes) -> Header:
    """Decode prefix and header from the first bytes of an entry (no checksum: listing only)."""
    header_len, payload_len = decode_prefix(data)
    raw = data[PREFIX_SIZE:PREFIX_SIZE + header_len]
    if len(raw) != header_len:
        raise CorruptEntry("truncated header")
    try:
        fields = msgpack.unpackb(raw, raw=False, use_list=True)
    except _MSGPACK_ERRORS as exc:
        raise CorruptEntry(f"unreadable header: {exc}") from None
    key, created, meta = _header_fields(fields)
    return Header(key, created, meta, header_len, payload_len)


def _header_fields(fields: object) -> tuple[str, float, dict]:
    if not isinstance(fields, dict):
        raise CorruptEntry("header is not a map")
    key, created, meta = fields.get("key"), fields.get("created"), fields.get("meta")
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise CorruptEntry("header has no valid key")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        raise CorruptEntry("header has no valid created time")
    if not isinstance(meta, dict) or not _check_meta_value(meta, 0):
        raise CorruptEntry("header has no valid meta map")
    return key, float(created), meta


def decode_entry(data: bytes) -> Entry:
    """Decode and verify a whole entry; raises only CorruptEntry (VersionMismatch for another format)."""
    data = bytes(data)
    header_len, payload_len = decode_prefix(data)
    body_end = PREFIX_SIZE + header_len + payload_len
    if len(data) != body_end + DIGEST_SIZE:
        raise CorruptEntry(f"size {len(data)} does not match header (expected {body_end + DIGEST_SIZE})")
    digest = hashlib.blake2b(memoryview(data)[:body_end], digest_size=DIGEST_SIZE).digest()
    if digest != data[body_end:]:
        raise CorruptEntry("checksum mismatch")
    header = decode_header(data[:PREFIX_SIZE + header_len])
    return Entry(header.key, data[PREFIX_SIZE + header_len:body_end], header.meta, header.created, FORMAT_VERSION)


def decode_as(key: str, data: bytes) -> Entry:
    """The entry in ``data``, which must be stored under ``key`` (CorruptEntry otherwise)."""
    entry = decode_entry(data)
    if entry.key != key:
        raise CorruptEntry(f"foreign entry: header key {entry.key!r}")
    return entry
