"""The signed file both shipped formats use (packages, precompiled artifacts), and its one reader.

A file is a magic number (its last byte the format's version), the payload's SHA-256, an HMAC-SHA256 tag of
that digest under ``HPURECIPE_BUNDLE_KEY`` (zeros: unsigned) and the payload. The reader opens regular files
only (a FIFO or a device is refused without blocking), caps the size, checks the header, hashes the file in
chunks and checks the signature before the payload is held in memory, then reads the payload once and checks
it is the one hashed. What a format accepts unsigned, and how it words each refusal, is the caller's: the
reader raises ``SignedFileError`` with a ``reason`` the caller names in its own words.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from recipecache import safeio
from recipecache.signing import TAG_BYTES, sign, verify

from ..errors import HpuBackendError

DIGEST_BYTES = 32
CHUNK = 1 << 20
UNSIGNED = bytes(TAG_BYTES)
REASONS = ("magic", "version", "size", "checksum", "unsigned", "unchecked", "signature", "changed")


class SignedFileError(HpuBackendError, ValueError):
    """A signed file refused; ``reason`` is one of REASONS, ``detail`` what the reason needs (a version, a size)."""

    def __init__(self, reason: str, detail: object = None):
        super().__init__(reason if detail is None else f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Policy:
    """What a format accepts: ``unsigned`` (a file with a zero tag), ``unchecked`` (a signed file when no key is
    set here to check it)."""

    unsigned: bool
    unchecked: bool


@dataclass
class SignedFile:
    payload: bytes
    digest: bytes
    signed: bool  # its signature was checked with the key
    size: int  # of the file
    tag: bytes = UNSIGNED  # its signature, as stored


def header_bytes(magic: bytes) -> int:
    return len(magic) + DIGEST_BYTES + TAG_BYTES


def framed(magic: bytes, payload: bytes, key: bytes | None) -> bytes:
    """The file's bytes: magic, the payload's digest, its signature (zeros without ``key``), the payload."""
    digest = hashlib.sha256(payload).digest()
    return magic + digest + (sign(key, [magic, digest]) if key else UNSIGNED) + payload


def check_header(head: bytes, magic: bytes, key: bytes | None, policy: Policy) -> tuple[bytes, bool]:
    """The payload's digest and whether the signature was checked; SignedFileError unless ``head`` is this
    format's header and its signature is accepted under ``policy``."""
    if len(head) < header_bytes(magic) or not head.startswith(magic[:-1]):
        raise SignedFileError("magic")
    if head[:len(magic)] != magic:
        raise SignedFileError("version", head[len(magic) - 1])
    digest, tag = head[len(magic):len(magic) + DIGEST_BYTES], head[len(magic) + DIGEST_BYTES:header_bytes(magic)]
    if tag == UNSIGNED:
        if not policy.unsigned:
            raise SignedFileError("unsigned")
        return digest, False
    if key is None:
        if not policy.unchecked:
            raise SignedFileError("unchecked")
        return digest, False
    if not verify(key, [magic, digest], tag):
        raise SignedFileError("signature")
    return digest, True


def read_signed(path: str | os.PathLike, magic: bytes, key: bytes | None, policy: Policy,
                max_bytes: int) -> SignedFile:
    """The checked payload of a signed file; SignedFileError (or OSError) if it is refused."""
    with open_regular(Path(path)) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise SignedFileError("size", size)
        head = f.read(header_bytes(magic))
        digest, signed = check_header(head, magic, key, policy)
        h = hashlib.sha256()
        start = f.tell()
        while chunk := f.read(CHUNK):
            h.update(chunk)
        if h.digest() != digest:
            raise SignedFileError("checksum")
        f.seek(start)
        payload = f.read(size)
    if hashlib.sha256(payload).digest() != digest:  # changed between the check and the read
        raise SignedFileError("changed")
    return SignedFile(payload, digest, signed, size, head[len(magic) + DIGEST_BYTES:header_bytes(magic)])


def open_regular(path: Path):
    """``path`` opened for reading without blocking (a FIFO would), if it is a regular file; else
    SignedFileError("not a regular file"). A link the user names is followed (a shipped file is not a file
    inside the cache)."""
    try:
        fd = safeio.open_regular(path, follow_links=True)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise ValueError("not a regular file") from None
        raise
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
