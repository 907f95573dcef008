"""The disk tier's files: sharded layout, write-once atomic publishing, lock-free reads, quarantine, scans."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .entry import KEY_RE, PREFIX_SIZE, Header, decode_header, decode_prefix
from .errors import CacheError, CorruptEntry
from .safeio import FILE_FLAGS, NOFOLLOW, read_at_most

logger = logging.getLogger("recipecache")

ENTRY_SUFFIX = ".rcp"
_SUFFIX_LEN = len(ENTRY_SUFFIX)
# Temp files start with a dot: listings skip dot files and readers only open exact entry names.
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 600.0
QUARANTINE_KEEP = 64
QUARANTINE_NAME = 200  # characters of a file's name kept in its quarantine name (with a 20-digit time: < 255)
_HEADER_PEEK = 4096
# Files in the cache are opened relative to their directory, neither of which may be a symbolic link,
# and without blocking (a FIFO named like an entry must not hang a reader); then fstat must say "regular".
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _write_file(fd: int, data: bytes) -> None:
    """Write all of data to fd; a module-level hook so tests can inject ENOSPC or EROFS."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class FileItem(NamedTuple):
    """One entry file found by a scan (a tuple: scans build thousands of these)."""

    key: str
    path: str  # a str, not a Path: building 10k Path objects would dominate a scan
    size: int
    mtime: float


@dataclass(frozen=True)
class ReadResult:
    """The bytes of an entry file and the identity of the inode they came from (``problem`` says why a
    file in an entry's place is not one: a symbolic link, a FIFO, a device; its data is then empty)."""

    data: bytes
    ident: tuple
    mtime: float
    problem: str | None = None


def identity(st: os.stat_result) -> tuple:
    """What tells one file from a later one that reuses its inode."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _InDir:
    """An open directory, not reached through a symbolic link: ``with _InDir(path) as fd`` (OSError, ELOOP,
    if it is a link; NotADirectoryError or FileNotFoundError if it is no directory)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self) -> int:
        self.fd = os.open(self.path, _DIR_FLAGS)
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def read_file(path, allow_shared: bool = True) -> ReadResult | None:
    """Read the regular file at ``path`` without following links or blocking; None if it is absent or its
    directory is a link or writable by others (unless ``allow_shared``): such a directory is not ours."""
    path = Path(path)
    try:
        with _InDir(path.parent) as dfd:
            if not allow_shared and not _private(os.fstat(dfd)):
                return None
            try:
                fd, st = _open_regular(path.name, dfd)
            except CorruptEntry as exc:  # a link, FIFO or device in an entry's place
                st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
                return ReadResult(b"", identity(st), st.st_mtime, str(exc))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None  # the directory is a link: never followed
        raise
    try:
        # An open descriptor keeps the inode alive, so a concurrent eviction cannot cut this read short.
        data = read_at_most(fd, st.st_size)
    finally:
        os.close(fd)
    return ReadResult(data, identity(st), st.st_mtime)


class DiskStore:
    """Files under <root>/entries/<first two key chars>/<key>.rcp, plus <root>/quarantine."""

    def __init__(self, root: Path, fsync: bool = True):
        self.root = Path(root)
        self.entries_dir = self.root / "entries"
        self.quarantine_dir = self.root / "quarantine"
        self.fsync = fsync
        self.allow_shared = False
        self.quarantine_bytes: int | None = None  # set by the cache: a small part of its limit
        self.unreadable: dict[str, str] = {}  # shard directories the last scan could not list, and why

    def open(self, allow_shared: bool, create: bool = True) -> None:
        """Create (with ``create``) the private directory tree; CacheError if others may write it or a
        subdirectory is a symbolic link (OSError if we cannot). Without ``create``, nothing is made: the
        tree must be there (FileNotFoundError otherwise)."""
        self.allow_shared = allow_shared
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            _mkdir(self.root)
        if not allow_shared:
            check_private(self.root)
        for sub in (self.entries_dir, self.quarantine_dir):
            if create:
                _mkdir(sub)
            check_private(sub, allow_shared, link_ok=False)

    def entry_path(self, key: str) -> Path:
        return self.entries_dir / key[:2] / (key + ENTRY_SUFFIX)

    def exists(self, key: str) -> bool:
        return os.path.exists(self.entry_path(key))

    def read(self, key: str) -> ReadResult | None:
        """Read one entry without locking; None if it is absent (or was evicted before we opened it)."""
        return read_file(self.entry_path(key), self.allow_shared)

    def read_header(self, path) -> Header:
        """Decode only the header of an entry file (CorruptEntry if it is unusable or sized wrong)."""
        path = Path(path)
        with _InDir(path.parent) as dfd:
            fd, _ = _open_regular(path.name, dfd)
        with os.fdopen(fd, "rb") as f:
            data = f.read(_HEADER_PEEK)
            header_len, _ = decode_prefix(data)
            if PREFIX_SIZE + header_len > len(data):
                data += f.read(PREFIX_SIZE + header_len - len(data))
            size = os.fstat(f.fileno()).st_size
        header = decode_header(data)
        if header.total_size != size:
            raise CorruptEntry(f"size {size} does not match header (expected {header.total_size})")
        return header

    def write_temp(self, key: str, data: bytes, mtime: float) -> Path:
        """Write data to a private temp file next to the entry; the caller publishes or discards it."""
        shard = self.entries_dir / key[:2]
        try:
            os.mkdir(shard, 0o700)  # not makedirs: a vanished cache directory must stay vanished
        except FileExistsError:
            pass
        tmp = shard / f"{TEMP_PREFIX}{key}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        with _InDir(shard) as dfd:  # OSError (the tier degrades) if the shard is a link or others can write it
            if not self.allow_shared and not _private(os.fstat(dfd)):
                raise PermissionError(errno.EPERM, "shard directory is writable by other users", str(shard))
            fd = os.open(tmp.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=dfd)
        try:
            _write_file(fd, data)
            if self.fsync:
                os.fsync(fd)
            os.utime(fd, (mtime, mtime))  # mtime is the entry's last use, in the cache clock
        except BaseException:
            os.close(fd)
            discard(tmp)
            raise
        os.close(fd)
        return tmp

    def publish(self, tmp: Path, key: str) -> bool:
        """Give tmp its entry name unless the entry exists (write-once); always consumes tmp."""
        final = self.entry_path(key)
        try:
            os.link(tmp, final)  # fails atomically if another process published first
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            return self._publish_by_rename(tmp, final)  # filesystems without hard links
        finally:
            discard(tmp)

    @staticmethod
    def _publish_by_rename(tmp: Path, final: Path) -> bool:
        # Only called under the cache lock, so the exists check cannot race another publisher.
        if final.exists():
            return False
        os.replace(tmp, final)
        return True

    def scan(self) -> list[FileItem]:
        """Every published entry file (temp and foreign files are skipped)."""
        items = []
        for shard in _subdirs(self.entries_dir):
            for de in self._shard(shard):
                if _kind(shard.name, de.name) == "entry":
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed by another process between listing and stat
                    items.append(FileItem(de.name[:-_SUFFIX_LEN], de.path, st.st_size, st.st_mtime))
        return items

    def foreign_files(self) -> list[tuple[Path, str]]:
        """(path, reason) for what does not belong in the entries tree: files that are neither entries in
        their right shard nor temp files, links in place of shards, shards others can write or nobody can list."""
        found = [(Path(de.path), "foreign file") for de in _listdir(self.entries_dir)
                 if not de.is_dir(follow_symlinks=False)]
        for shard in _subdirs(self.entries_dir):
            st = _stat(shard)
            if st is not None and not self.allow_shared and not _private(st):
                found.append((Path(shard.path), "shard directory writable by other users"))
            found += [(Path(de.path), "foreign file") for de in self._shard(shard)
                      if _kind(shard.name, de.name) == "foreign"]
        return found + [(Path(path), f"unreadable shard directory ({reason})")
                        for path, reason in sorted(self.unreadable.items())]

    def sweep_temps(self, older_than_s: float = STALE_TEMP_S) -> int:
        """Remove temp files left by killed writers (compared with the real file mtime)."""
        cutoff, removed = time.time() - older_than_s, 0
        for shard in _subdirs(self.entries_dir):
            for de in self._shard(shard):
                st = _stat(de) if _kind(shard.name, de.name) == "temp" else None
                # Temps carry the entry's clock as mtime, so also use ctime, which only the kernel sets.
                if st is not None and max(st.st_ctime, st.st_mtime) < cutoff:
                    removed += discard(Path(de.path))
        return removed

    def _shard(self, shard) -> list:
        """The files of one shard directory; one that cannot be listed is skipped and noted in
        ``unreadable`` (with one warning), so one bad shard never takes the others down."""
        try:
            found = _listdir(shard)
        except OSError as exc:
            if shard.path not in self.unreadable:
                logger.warning("recipe cache: skipping unreadable shard directory %s (%s)", shard.path,
                               exc.strerror or exc)
            self.unreadable[shard.path] = exc.strerror or str(exc)
            return []
        self.unreadable.pop(shard.path, None)
        return found

    def overhead_bytes(self) -> int:
        """Bytes of the files that are not entries: bookkeeping in the root, manifests, quarantine."""
        total = 0
        for directory in (self.root, self.root / "manifests", self.quarantine_dir):
            for de in _listdir(directory):
                st = _stat(de)
                if st is not None and stat.S_ISREG(st.st_mode):
                    total += st.st_size
        return total

    def touch(self, key: str, t: float) -> None:
        """Set an entry's mtime (its last use) without following links; OSError if that fails, or if the file
        has another hard link (its times are shared with a file that may be outside the cache)."""
        path = self.entry_path(key)
        with _InDir(path.parent) as dfd:
            fd, st = _open_regular(path.name, dfd)
            try:
                if st.st_nlink > 1:
                    raise OSError(errno.EMLINK, "an entry with other hard links is not touched", str(path))
                os.utime(fd, (t, t))
            finally:
                os.close(fd)

    def quarantine(self, path) -> bool:
        """Move a bad file (or link, or foreign directory) out of the entries tree, keeping the newest few
        for inspection. Never moves anything into or out of a directory reached through a link."""
        path = Path(path)
        target = f"{path.name[:QUARANTINE_NAME]}.{time.time_ns()}"  # a foreign name may be as long as allowed
        try:
            with _InDir(path.parent) as src, _InDir(self.quarantine_dir) as dst:
                os.replace(path.name, target, src_dir_fd=src, dst_dir_fd=dst)
        except FileNotFoundError:
            return False
        self._cap_quarantine()
        return True

    def _cap_quarantine(self) -> None:
        """Keep the newest QUARANTINE_KEEP files, within ``quarantine_bytes`` (if set) in all."""
        files = sorted(_listdir(self.quarantine_dir), key=lambda de: de.name.rsplit(".", 1)[-1], reverse=True)
        kept = 0
        for i, de in enumerate(files):
            st = _stat(de)
            kept += st.st_size if st is not None and stat.S_ISREG(st.st_mode) else 0
            if i >= QUARANTINE_KEEP or (self.quarantine_bytes is not None and kept > self.quarantine_bytes):
                if de.is_dir(follow_symlinks=False):
                    shutil.rmtree(de.path, ignore_errors=True)  # a foreign shard directory set aside
                else:
                    discard(Path(de.path))


def check_private(root: Path, allow_shared: bool = False, link_ok: bool = True) -> None:
    """CacheError unless root is a directory (not a link, unless ``link_ok``) owned by us that group and
    others cannot write (unless ``allow_shared``)."""
    st = os.stat(root) if link_ok else os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise CacheError(f"recipe cache path {root} is {kind}; remove it (the cache recreates it)")
    if allow_shared:
        return
    if not _private(st):
        raise CacheError(
            f"refusing recipe cache directory {root}: it is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}); anyone who can write it can plant recipes. "
            f"Use a private directory (chmod 700) or pass allow_shared_dir=True if the sharing is intended.")


def _open_regular(name: str, dfd: int) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file ``name`` in the directory ``dfd``, opened without following a link or
    blocking; CorruptEntry for a link, FIFO or device."""
    try:
        fd = os.open(name, os.O_RDONLY | FILE_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptEntry("a symbolic link, not an entry file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptEntry("not a regular file")
    return fd, st


def _kind(shard: str, name: str) -> str:
    """'entry', 'temp' or 'foreign' for a file name inside a shard directory."""
    if name.startswith(TEMP_PREFIX):
        return "temp" if name.endswith(TEMP_SUFFIX) else "foreign"
    if name.endswith(ENTRY_SUFFIX) and name.startswith(shard) and KEY_RE.fullmatch(name, 0, len(name) - _SUFFIX_LEN):
        return "entry"
    return "foreign"


def holds_cache(root) -> bool:
    """Whether ``root`` holds a recipe cache: its ``entries/`` is a directory (not a link)."""
    try:
        return stat.S_ISDIR(os.lstat(Path(root) / "entries").st_mode)
    except OSError:
        return False


def _mkdir(path: Path) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def discard(path) -> bool:
    """Unlink path; False if it was already gone."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _subdirs(path: Path) -> list:
    return [de for de in _listdir(path) if de.is_dir(follow_symlinks=False)]


def _listdir(path) -> list:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _stat(de):
    try:
        return de.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed by another process between listing and stat
