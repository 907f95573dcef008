"""The disk tier's files: sharded layout, write-once atomic publishing, lock-free reads, quarantine, scans."""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .entry import KEY_RE, PREFIX_SIZE, Header, decode_header, decode_prefix
from .errors import CacheError, CorruptEntry

ENTRY_SUFFIX = ".rcp"
_SUFFIX_LEN = len(ENTRY_SUFFIX)
# Temp files start with a dot: listings skip dot files and readers only open exact entry names.
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 600.0
QUARANTINE_KEEP = 64
_HEADER_PEEK = 4096


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
    """The bytes of an entry file and the identity of the inode they came from."""

    data: bytes
    ident: tuple
    mtime: float


class DiskStore:
    """Files under <root>/entries/<first two key chars>/<key>.rcp, plus <root>/quarantine."""

    def __init__(self, root: Path, fsync: bool = True):
        self.root = Path(root)
        self.entries_dir = self.root / "entries"
        self.quarantine_dir = self.root / "quarantine"
        self.fsync = fsync

    def open(self, allow_shared: bool) -> None:
        """Create the private directory tree; CacheError if others may write it (OSError if we cannot)."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.root, 0o700)
        except FileExistsError:
            pass
        if not allow_shared:
            check_private(self.root)
        for sub in (self.entries_dir, self.quarantine_dir):
            try:
                os.mkdir(sub, 0o700)
            except FileExistsError:
                pass

    def entry_path(self, key: str) -> Path:
        return self.entries_dir / key[:2] / (key + ENTRY_SUFFIX)

    def exists(self, key: str) -> bool:
        return os.path.exists(self.entry_path(key))

    def read(self, key: str) -> ReadResult | None:
        """Read one entry without locking; None if it is absent (or was evicted before we opened it)."""
        try:
            fd = os.open(self.entry_path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            # An open descriptor keeps the inode alive, so a concurrent eviction cannot cut this read short.
            chunks, remaining = [], st.st_size
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
        finally:
            os.close(fd)
        return ReadResult(b"".join(chunks), (st.st_dev, st.st_ino, st.st_size), st.st_mtime)

    def read_header(self, path) -> Header:
        """Decode only the header of an entry file (CorruptEntry if it is unusable or sized wrong)."""
        with open(path, "rb") as f:
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
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
            for de in _listdir(shard):
                if _kind(shard.name, de.name) == "entry":
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed by another process between listing and stat
                    items.append(FileItem(de.name[:-_SUFFIX_LEN], de.path, st.st_size, st.st_mtime))
        return items

    def foreign_files(self) -> list[Path]:
        """Files in the entries tree that are neither entries in their right shard nor temp files."""
        found = [Path(de.path) for de in _listdir(self.entries_dir) if not de.is_dir(follow_symlinks=False)]
        return found + [Path(de.path) for shard in _subdirs(self.entries_dir) for de in _listdir(shard)
                        if _kind(shard.name, de.name) == "foreign"]

    def sweep_temps(self, older_than_s: float = STALE_TEMP_S) -> int:
        """Remove temp files left by killed writers (compared with the real file mtime)."""
        cutoff, removed = time.time() - older_than_s, 0
        for shard in _subdirs(self.entries_dir):
            for de in _listdir(shard):
                st = _stat(de) if _kind(shard.name, de.name) == "temp" else None
                # Temps carry the entry's clock as mtime, so also use ctime, which only the kernel sets.
                if st is not None and max(st.st_ctime, st.st_mtime) < cutoff:
                    removed += discard(Path(de.path))
        return removed

    def quarantine(self, path) -> bool:
        """Move a bad file out of the entries tree (keeping the newest few for inspection)."""
        target = self.quarantine_dir / f"{os.path.basename(path)}.{time.time_ns()}"
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return False
        self._cap_quarantine()
        return True

    def _cap_quarantine(self) -> None:
        files = sorted(_listdir(self.quarantine_dir), key=lambda de: de.name.rsplit(".", 1)[-1])
        for de in files[:max(0, len(files) - QUARANTINE_KEEP)]:
            discard(Path(de.path))


def check_private(root: Path) -> None:
    """CacheError unless root is a directory owned by us that group and others cannot write."""
    st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"recipe cache path {root} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise CacheError(
            f"refusing recipe cache directory {root}: it is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}); anyone who can write it can plant recipes. "
            f"Use a private directory (chmod 700) or pass allow_shared_dir=True if the sharing is intended.")


def _kind(shard: str, name: str) -> str:
    """'entry', 'temp' or 'foreign' for a file name inside a shard directory."""
    if name.startswith(TEMP_PREFIX):
        return "temp" if name.endswith(TEMP_SUFFIX) else "foreign"
    if name.endswith(ENTRY_SUFFIX) and name.startswith(shard) and KEY_RE.fullmatch(name, 0, len(name) - _SUFFIX_LEN):
        return "entry"
    return "foreign"


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
