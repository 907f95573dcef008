"""Opening the cache's small files safely: regular files only, never through a symbolic link, never blocking
(a FIFO or a device in a file's place must not hang or flood a reader), read up to a size cap, and never
written in place while they have a second name (a hard link from outside the cache would be written through).

Every bookkeeping file (size.json, stats.json, hits.log, config.json, evictions.log, clear.marker,
manifests) is opened through these functions; entries go through disk.py, which uses the same flags.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Opened without following a final link and without blocking; then fstat must say "regular".
FILE_FLAGS = NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_SMALL = 16 * 1024 * 1024  # a bookkeeping file (the logs rotate well below this)

logger = logging.getLogger("recipecache")


def open_regular(path, flags: int = os.O_RDONLY, mode: int = 0o600, dir_fd: int | None = None,
                 follow_links: bool = False, one_name: bool = False) -> int:
    """A descriptor of the regular file ``path``, opened with ``flags`` plus FILE_FLAGS; OSError (ELOOP for a
    link, EINVAL for a FIFO, device or directory; EMLINK, with ``one_name``, for a file with other hard links)
    otherwise. ``follow_links`` is for a file the user names (a package), never for one inside the cache;
    ``one_name`` is for a file about to be written in place."""
    fd = os.open(path, flags | (FILE_FLAGS & ~NOFOLLOW if follow_links else FILE_FLAGS), mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if one_name and st.st_nlink > 1:
            raise OSError(errno.EMLINK, "a file with other hard links (refused: writing it would change them)",
                          str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path, limit: int = MAX_SMALL) -> bytes:
    """The bytes of the regular file ``path``; OSError if it is missing, not a regular file, a link, or
    larger than ``limit`` (EFBIG)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, over the {limit}-byte limit", str(path))
        data = read_at_most(fd, limit + 1)  # the file may grow while we read: never past the cap
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"over the {limit}-byte limit", str(path))
    return data


def read_at_most(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd``, in chunks of at most 1 MiB, stopping early at end of file."""
    chunks, remaining = [], n
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def append(path, data: bytes) -> int:
    """Append ``data`` to the regular file ``path`` (created 0600) in one write; the file's size after it.
    A file with other hard links is never appended to: it is replaced by a fresh one holding just ``data``
    (its old lines are dropped, since whoever linked it chose them), with one warning."""
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, one_name=True)
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
        logger.warning("recipe cache: %s has other hard links; replacing it instead of appending to it", path)
        write_atomic(path, data)
        return len(data)
    try:
        os.write(fd, data)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def write_atomic(path, data: bytes) -> None:
    """Replace a small file atomically (a fresh private temp file, then rename; no fsync: scans repair it).
    A link planted at the temp name is replaced, never written through."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)
