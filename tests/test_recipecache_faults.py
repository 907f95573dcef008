"""Fault injection: damaged entries, vanished or read-only or full disks, unsafe directories, a held lock."""

import errno
import logging
import os
import shutil
import struct

import pytest
from filelock import FileLock

import recipecache.disk
from recipecache import FORMAT_VERSION, CacheConfig, CacheError, RecipeCache, encode_entry


def make(tmp_path, **kwargs):
    kwargs.setdefault("fsync", False)
    return RecipeCache(CacheConfig(path=tmp_path / "cache", **kwargs))


def entry_file(cache, key):
    return cache.path / "entries" / key[:2] / f"{key}.rcp"


def quarantined(cache):
    return sorted(p.name.split(".rcp")[0] for p in (cache.path / "quarantine").iterdir())


def _truncate(data):
    return data[: len(data) // 2]


def _flip(data):
    return data[:30] + bytes([data[30] ^ 0x40]) + data[31:]


def _magic(data):
    return b"XXXX" + data[4:]


def _foreign(_data):
    return encode_entry("zz99", b"someone else's recipe")


@pytest.mark.parametrize("damage", [_truncate, _flip, _magic, lambda d: b"", _foreign],
                         ids=["truncated", "flipped-byte", "wrong-magic", "empty", "foreign"])
def test_damaged_entry_is_a_counted_quarantined_miss(tmp_path, damage):
    make(tmp_path).put("ab01", b"payload" * 100, wait=True)
    path = entry_file(make(tmp_path), "ab01")
    path.write_bytes(damage(path.read_bytes()))
    cache = make(tmp_path)
    assert cache.get("ab01") is None
    cache.flush()
    assert cache.stats()["corrupt"] == 1 and cache.stats()["misses"] == 1
    assert not path.exists() and quarantined(cache) == ["ab01"]
    assert cache.total_bytes() == 0
    cache.put("ab01", b"fresh", wait=True)  # the slot is free again
    assert make(tmp_path, memory_entries=0).get("ab01") == b"fresh"


def test_old_format_version_is_a_plain_miss_and_replaced(tmp_path):
    cache = make(tmp_path, memory_entries=0)
    cache.put("ab01", b"v1", wait=True)
    path = entry_file(cache, "ab01")
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 4, FORMAT_VERSION - 1)
    path.write_bytes(bytes(data))
    assert cache.get("ab01") is None
    cache.flush()
    assert cache.stats()["corrupt"] == 0 and quarantined(cache) == [] and not path.exists()
    assert cache.total_bytes() == 0
    cache.put("ab01", b"v-current", wait=True)
    assert cache.get("ab01") == b"v-current"


def test_verify_reports_and_fix_quarantines(tmp_path):
    cache = make(tmp_path)
    for key in ("aa", "bb", "cc"):
        cache.put(key, key.encode() * 50, wait=True)
    entry_file(cache, "bb").write_bytes(b"")
    (cache.path / "entries" / "aa" / "notes.txt").write_text("stray")
    bad = cache.verify()
    assert sorted(name for name, _ in bad) == ["bb", "notes.txt"]
    assert cache.verify(fix=True) == bad
    assert cache.verify() == [] and [i.key for i in cache.entries()] == ["aa", "cc"]
    assert cache.total_bytes() == sum(i.size for i in cache.entries())


def test_directory_removed_while_open_degrades_to_memory(tmp_path, caplog):
    cache = make(tmp_path)
    cache.put("aa", b"kept", wait=True)
    shutil.rmtree(cache.path)
    with caplog.at_level(logging.WARNING, "recipecache"):
        for key in ("bb", "cc", "dd"):
            cache.put(key, key.encode(), wait=True)
        cache.flush()
    assert caplog.text.count("disk tier disabled") == 1
    assert cache.enabled is False
    assert (cache.get("aa"), cache.get("bb"), cache.get("zz")) == (b"kept", b"bb", None)
    assert not cache.path.exists()  # not silently recreated with default permissions


def test_full_disk_warns_once_and_serves_from_memory(tmp_path, monkeypatch, caplog):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    cache = make(tmp_path)
    monkeypatch.setattr(recipecache.disk, "_write_file", full)
    with caplog.at_level(logging.WARNING, "recipecache"):
        for key in ("aa", "bb"):
            cache.put(key, b"x" * 100, wait=True)
    assert caplog.text.count("No space left on device") == 1
    assert (cache.enabled, cache.get("aa"), cache.total_bytes()) == (False, b"x" * 100, 0)
    assert [p for p in cache.path.rglob("*") if p.is_file() and p.parent.name == "aa"] == []  # no temp left


def _make_read_only(cache, monkeypatch):
    """chmod 0500 stops a normal user; root ignores mode bits, so inject the error the kernel would give."""
    if os.geteuid() != 0:
        for p in [cache.path, *cache.path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o500)
        return

    def read_only(fd, data):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(recipecache.disk, "_write_file", read_only)


def test_read_only_cache_still_serves_reads(tmp_path, monkeypatch, caplog):
    make(tmp_path).put("aa", b"shipped", wait=True)
    cache = make(tmp_path, memory_entries=0)
    _make_read_only(cache, monkeypatch)
    with caplog.at_level(logging.WARNING, "recipecache"):
        cache.put("bb", b"new", wait=True)
        cache.put("cc", b"new", wait=True)
    assert cache.enabled is False and caplog.text.count("disk tier disabled") == 1
    assert cache.get("aa") == b"shipped"  # the read-only disk still serves
    assert not entry_file(cache, "bb").exists()
    for p in [cache.path, *cache.path.rglob("*")]:
        if p.is_dir():
            p.chmod(0o700)


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_directory_writable_by_others_is_refused(tmp_path, mode):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(mode)
    with pytest.raises(CacheError, match="writable by other users"):
        make(tmp_path)
    assert make(tmp_path, allow_shared_dir=True).enabled


def test_held_lock_times_out_without_failing_the_caller(tmp_path, caplog):
    cache = make(tmp_path, lock_timeout_s=0.2)
    with FileLock(str(cache.path / "eviction.lock")):
        with caplog.at_level(logging.WARNING, "recipecache"):
            cache.put("aa", b"x", wait=True)
    assert "could not lock" in caplog.text
    assert cache.enabled and cache.get("aa") == b"x"
    assert list((cache.path / "entries").rglob("*.tmp")) == []
    cache.put("bb", b"y", wait=True)  # the lock is free again
    assert entry_file(cache, "bb").exists()


def test_entry_evicted_before_open_is_a_miss(tmp_path):
    writer = make(tmp_path)
    writer.put("aa", b"x", wait=True)
    reader = make(tmp_path, memory_entries=0)
    assert reader.contains("aa")
    writer.remove("aa")
    assert reader.get("aa") is None


def test_entry_evicted_during_read_is_read_whole(tmp_path, monkeypatch):
    make(tmp_path).put("aa", b"y" * 50_000, wait=True)
    cache = make(tmp_path, memory_entries=0)
    real_fstat, entry_inode = os.fstat, entry_file(cache, "aa").stat().st_ino

    def evict_then_fstat(fd):
        if real_fstat(fd).st_ino == entry_inode:  # the entry's fstat (not a bookkeeping file's)
            entry_file(cache, "aa").unlink(missing_ok=True)  # another process evicts after our open()
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", evict_then_fstat)
    assert cache.get("aa") == b"y" * 50_000
    monkeypatch.undo()
    assert cache.get("bb") is None and cache.stats()["corrupt"] == 0


# -- what is in the cache directory is opened without following links or blocking -----------------------

@pytest.fixture
def alarm():
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""
    import signal

    def timeout(*_):
        raise TimeoutError("blocked on a file in the cache")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_fifo_named_like_an_entry_is_a_quarantined_miss_and_hangs_nothing(tmp_path, alarm):
    cache = make(tmp_path, memory_entries=0)
    cache.put("ab01", b"fine", wait=True)
    os.mkfifo(entry_file(cache, "ab02"), 0o600)
    assert [i.key for i in cache.entries()] == ["ab01"]  # listing reads headers: no hang, no bad entry
    assert ("ab02", "not a regular file") in cache.verify()
    assert cache.get("ab02") is None and cache.get("ab01") == b"fine"
    cache.flush()
    assert quarantined(cache) == ["ab02"] and cache.stats()["corrupt"] == 1


def test_a_link_in_place_of_an_entry_is_never_followed(tmp_path):
    outside = tmp_path / "outside.rcp"
    make(tmp_path).put("ab01", b"real", wait=True)
    cache = make(tmp_path, memory_entries=0)
    os.replace(entry_file(cache, "ab01"), outside)
    os.utime(outside, (1_000_000, 1_000_000))
    os.symlink(outside, entry_file(cache, "ab01"))
    assert cache.get("ab01") is None
    cache.flush()
    assert quarantined(cache) == ["ab01"] and os.stat(outside).st_mtime == 1_000_000  # moved the link only
    assert outside.read_bytes().startswith(encode_entry("ab01", b"real")[:4])


def test_a_linked_shard_is_never_written_through_and_verify_fix_removes_it(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cache = make(tmp_path)
    os.symlink(outside, cache.path / "entries" / "cd")
    cache.put("cd01", b"x" * 100, wait=True)  # the disk tier refuses (and degrades), nothing lands outside
    assert list(outside.iterdir()) == []
    admin = make(tmp_path)
    assert (str(cache.path / "entries" / "cd").rsplit("/", 1)[-1], "foreign file") in admin.verify()
    admin.verify(fix=True)
    assert not (cache.path / "entries" / "cd").exists() and outside.is_dir() and list(outside.iterdir()) == []


@pytest.mark.parametrize("sub", ["entries", "quarantine"])
def test_a_linked_or_shared_subdirectory_is_refused_like_the_root(tmp_path, sub):
    make(tmp_path)
    target = tmp_path / "cache" / sub
    target.chmod(0o777)
    with pytest.raises(CacheError, match="writable by other users"):
        make(tmp_path)
    shutil.rmtree(target)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, target)
    with pytest.raises(CacheError, match="symbolic link"):
        make(tmp_path)


def test_a_shard_others_can_write_is_not_read_and_is_listed(tmp_path):
    make(tmp_path).put("ef01", b"planted?", wait=True)
    cache = make(tmp_path, memory_entries=0)
    (cache.path / "entries" / "ef").chmod(0o777)
    assert cache.get("ef01") is None
    assert ("ef", "shard directory writable by other users") in cache.verify()
