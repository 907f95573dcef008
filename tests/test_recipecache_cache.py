"""RecipeCache behaviour in one process: tiers, write-once, eviction order, stats, admin calls."""

import logging
import os

import pytest

from recipecache import CacheConfig, DisabledCache, EntryInfo, RecipeCache, open_cache
from recipecache.cache import RECONCILE_INTERVAL_S, TOUCH_INTERVAL_S
from recipecache.entry import DIGEST_SIZE, PREFIX_SIZE
from recipecache.eviction import EvictionLog


class Clock:
    """An injected cache clock: tests move time instead of sleeping."""

    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now

    def tick(self, seconds=1.0):
        self.now += seconds
        return self.now


def make(tmp_path, clock=None, **kwargs):
    kwargs.setdefault("fsync", False)
    return open_cache(CacheConfig(path=tmp_path / "cache", **kwargs), clock=clock or Clock())


def entry_size(cache, key):
    return (cache.path / "entries" / key[:2] / f"{key}.rcp").stat().st_size


def test_put_then_get_from_memory_and_from_a_fresh_instance(tmp_path):
    cache = make(tmp_path)
    cache.put("aa01", b"recipe", {"graph": "fw"})
    assert cache.get("aa01") == b"recipe"
    cache.flush()
    other = make(tmp_path, memory_entries=0)
    entry = other.get_entry("aa01")
    assert (entry.payload, entry.meta) == (b"recipe", {"graph": "fw"})
    assert other.get("ffff") is None
    assert other.contains("aa01") and not other.contains("ffff")


def test_put_is_write_once(tmp_path):
    cache = make(tmp_path)
    cache.put("aa01", b"first", wait=True)
    cache.put("aa01", b"second", wait=True)
    assert make(tmp_path, memory_entries=0).get("aa01") == b"first"
    assert cache.get("aa01") == b"first"


def test_pending_writes_are_readable_before_they_land(tmp_path):
    cache = make(tmp_path, memory_entries=0)
    for i in range(50):
        cache.put(f"k{i:03d}", bytes([i]) * 100)
    assert all(cache.get(f"k{i:03d}") == bytes([i]) * 100 for i in range(50))
    cache.flush()
    assert len(cache.entries()) == 50


def test_memory_tier_is_bounded_lru(tmp_path):
    cache = make(tmp_path, memory_entries=2)
    for key in ("a1", "b1", "c1"):
        cache.put(key, key.encode(), wait=True)
    assert len(cache._memory) == 2 and "a1" not in cache._memory
    assert cache.get("a1") == b"a1"  # from disk, and now back in memory
    assert "a1" in cache._memory and "b1" not in cache._memory


@pytest.mark.parametrize("key", ["", "../etc", "a b", "x" * 129, "k.rcp"])
def test_invalid_keys_are_value_errors(tmp_path, key):
    cache = make(tmp_path)
    for call in (cache.get, cache.contains, cache.remove, lambda k: cache.put(k, b"")):
        with pytest.raises(ValueError):
            call(key)


def test_stats_persist_across_instances_and_reset(tmp_path):
    cache = RecipeCache(CacheConfig(path=tmp_path / "cache", fsync=False, memory_entries=0), clock=Clock(),
                        cost_of=lambda meta: meta["cost"])  # the caller's meta says what a hit saves
    cache.put("aa", b"x" * 10, {"cost": 2.5}, wait=True)
    cache.get("aa")
    cache.get("bb")
    cache.flush()
    stats = make(tmp_path).stats()
    assert (stats["hits"], stats["disk_hits"], stats["misses"]) == (1, 1, 1)
    assert stats["compile_time_saved_s"] == 2.5
    assert stats["bytes_written"] == stats["total_bytes"] == entry_size(cache, "aa")
    assert (stats["entries"], stats["path"]) == (1, str(cache.path))
    cache.reset_stats()
    assert make(tmp_path).stats()["hits"] == 0
    assert make(tmp_path).stats()["entries"] == 1  # resetting counters keeps the entries


def test_entries_report_headers_hits_and_sizes(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock, memory_entries=0)
    cache.put("aa", b"1" * 100, {"model": "m"}, wait=True)
    clock.tick(5)
    cache.put("bb", b"2" * 200, wait=True)
    cache.get("aa")
    cache.get("aa")
    infos = {i.key: i for i in cache.entries()}
    assert infos["aa"] == EntryInfo("aa", entry_size(cache, "aa"), 1_000_000.0, 1_000_000.0, 2, {"model": "m"})
    assert (infos["bb"].created, infos["bb"].hits) == (1_000_005.0, 0)


def test_oversize_entry_is_rejected_with_a_warning(tmp_path, caplog):
    cache = make(tmp_path, max_size_mb=0.001)  # ~1 KB
    with caplog.at_level(logging.WARNING, "recipecache"):
        cache.put("big", b"x" * 5000, wait=True)
    assert "larger than the cache limit" in caplog.text
    assert cache.entries() == [] and cache.total_bytes() == 0
    assert cache.get("big") == b"x" * 5000  # still served by this process's memory tier


def test_limit_zero_disables_everything(tmp_path):
    cache = make(tmp_path, max_size_mb=0)
    cache.put("aa", b"x", wait=True)
    assert (cache.enabled, cache.get("aa"), cache.contains("aa")) == (False, None, False)
    assert (cache.entries(), cache.evict(), cache.verify(), cache.stats()["entries"]) == ([], [], [], 0)
    assert isinstance(cache, DisabledCache) and isinstance(cache, RecipeCache) and not (tmp_path / "cache").exists()
    with pytest.raises(ValueError):
        cache.put("../bad key", b"x")  # validated all the same


def test_limit_zero_takes_every_constructor_argument_the_backend_passes(tmp_path):
    cache = open_cache(CacheConfig(path=tmp_path / "cache", max_size_mb=0), cost_of=lambda meta: 1.0,
                       remote_namespace="toolchain")
    assert not cache.enabled and cache.get("aa") is None and not (tmp_path / "cache").exists()


def test_unbounded_never_evicts(tmp_path):
    cache = make(tmp_path, max_size_mb=-1)
    for i in range(20):
        cache.put(f"k{i:02d}", os.urandom(5000))
    cache.flush()
    assert len(cache.entries()) == 20 and cache.stats()["evictions"] == 0
    assert cache.stats()["limit_bytes"] == -1


def _fill(cache, clock, keys, size=1000):
    for key in keys:
        clock.tick()
        cache.put(key, key.encode() * (size // len(key)), wait=True)


def test_lru_evicts_least_recently_used_first(tmp_path, caplog):
    clock = Clock()
    per_entry = PREFIX_SIZE + DIGEST_SIZE + 1000 + 40
    cache = make(tmp_path, clock, max_size_mb=4.5 * per_entry / 2**20, memory_entries=0, policy="lru")
    _fill(cache, clock, ["a0", "b0", "c0", "d0"])
    clock.tick(TOUCH_INTERVAL_S + 1)
    assert cache.get("a0") is not None  # refreshes a0's recency on disk
    with caplog.at_level(logging.INFO, "recipecache"):
        _fill(cache, clock, ["e0"])
    assert sorted(i.key for i in cache.entries()) == ["a0", "c0", "d0", "e0"]
    assert f"Removed b0 successfully. Disk cache size after removal: {cache.total_bytes()}" in caplog.text
    assert EvictionLog(cache.path / "evictions.log").keys() == {"b0"}


def test_hits_within_the_touch_interval_write_nothing(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock, memory_entries=0)
    cache.put("aa", b"x", wait=True)
    path = cache.path / "entries" / "aa" / "aa.rcp"
    clock.tick(TOUCH_INTERVAL_S / 2)
    cache.get("aa")
    assert path.stat().st_mtime == 1_000_000.0
    clock.tick(TOUCH_INTERVAL_S)
    cache.get("aa")
    assert path.stat().st_mtime == clock.now


def test_memory_hits_also_refresh_disk_recency(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock)
    cache.put("aa", b"x", wait=True)
    clock.tick(TOUCH_INTERVAL_S + 1)
    cache.get("aa")
    assert (cache.path / "entries" / "aa" / "aa.rcp").stat().st_mtime == clock.now


def test_created_policy_evicts_oldest_creation_despite_use(tmp_path):
    clock = Clock()
    per_entry = PREFIX_SIZE + DIGEST_SIZE + 1000 + 40
    cache = make(tmp_path, clock, max_size_mb=4.5 * per_entry / 2**20, memory_entries=0, policy="created")
    _fill(cache, clock, ["a0", "b0", "c0", "d0"])
    clock.tick(TOUCH_INTERVAL_S + 1)
    cache.get("a0")
    _fill(cache, clock, ["e0"])
    assert sorted(i.key for i in cache.entries()) == ["b0", "c0", "d0", "e0"]


def test_eviction_trims_just_below_the_limit(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock, max_size_mb=0.05)
    _fill(cache, clock, [f"k{i:03d}" for i in range(100)], size=2000)
    total = sum(i.size for i in cache.entries())
    assert total == cache.total_bytes() <= 0.99 * cache.stats()["limit_bytes"]
    assert cache.stats()["evictions"] == 100 - len(cache.entries())


def test_ledger_is_rebuilt_by_a_scan_when_missing_or_stale(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock)
    _fill(cache, clock, ["aa", "bb"])
    real = sum(i.size for i in cache.entries())
    (cache.path / "size.json").write_text("garbage")
    assert cache.total_bytes() == real
    (cache.path / "size.json").write_text('{"total": 1, "count": 1, "reconciled": 0}')
    clock.tick(RECONCILE_INTERVAL_S + 1)
    _fill(cache, clock, ["cc"])
    assert cache.total_bytes() == sum(i.size for i in cache.entries())


def test_evict_filters_plan_and_dry_run(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock)
    _fill(cache, clock, ["a0", "b0", "c0", "d0"])
    clock.tick(100)
    planned = cache.evict(keys=["b0", "c0"], dry_run=True)
    assert [i.key for i in planned] == ["b0", "c0"] and len(cache.entries()) == 4
    assert [i.key for i in cache.evict(older_than_s=101.5)] == ["a0", "b0"]
    assert [i.key for i in cache.evict(predicate=lambda i: i.key.startswith("d"))] == ["d0"]
    assert [i.key for i in cache.entries()] == ["c0"]
    assert cache.stats()["evictions"] == 3
    assert EvictionLog(cache.path / "evictions.log").keys() == {"a0", "b0", "d0"}


def test_evict_max_bytes_keeps_the_newest_that_fit(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock)
    _fill(cache, clock, ["a0", "b0", "c0"])
    one = entry_size(cache, "a0")
    assert [i.key for i in cache.evict(max_bytes=one)] == ["a0", "b0"]
    assert cache.total_bytes() == one


def test_remove_and_clear(tmp_path):
    clock = Clock()
    cache = make(tmp_path, clock)
    _fill(cache, clock, ["a0", "b0", "c0"])
    assert cache.remove("a0") and not cache.remove("a0")
    assert cache.get("a0") is None
    cache.clear()
    assert (cache.entries(), cache.total_bytes(), cache.get("b0")) == ([], 0, None)
    assert EvictionLog(cache.path / "evictions.log").keys() == {"a0", "b0", "c0"}


def test_temp_files_are_invisible_and_stale_ones_swept(tmp_path):
    cache = make(tmp_path)
    cache.put("aa", b"x", wait=True)
    shard = cache.path / "entries" / "aa"
    fresh, stale = shard / ".ab.1.fresh.tmp", shard / ".ab.2.stale.tmp"
    fresh.write_bytes(b"partial")
    stale.write_bytes(b"partial")
    os.utime(stale, (0, 0))
    assert [i.key for i in cache.entries()] == ["aa"] and cache.verify() == []
    assert cache._disk.sweep_temps(older_than_s=3600) == 0  # ctime is now: a live writer's file is kept
    assert cache._disk.sweep_temps(older_than_s=-1) == 2
    assert not fresh.exists() and not stale.exists()


def test_delete_on_start_clears_once_per_launch_and_at_every_new_launch(tmp_path, monkeypatch):
    from recipecache import startup

    make(tmp_path).put("old", b"x", wait=True)
    monkeypatch.setenv(startup.LAUNCH_ENV, "launch-1")
    first = make(tmp_path, delete_on_start=True)
    assert first.get("old") is None
    first.put("new", b"y", wait=True)
    assert make(tmp_path, delete_on_start=True, memory_entries=0).get("new") == b"y"  # same launch: kept
    monkeypatch.setenv(startup.LAUNCH_ENV, "launch-2")  # the next start, however soon
    assert make(tmp_path, delete_on_start=True).get("new") is None


def test_launch_id_comes_from_the_launcher_or_the_first_process():
    from recipecache.startup import launch_id

    assert launch_id({"HPU_RECIPE_CACHE_LAUNCH_ID": "x", "TORCHELASTIC_RUN_ID": "r"}) == "x"
    assert launch_id({"TORCHELASTIC_RUN_ID": "r1"}) == "TORCHELASTIC_RUN_ID=r1"
    assert launch_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}) == "SLURM_JOB_ID=7.2"
    own = launch_id({"TORCHELASTIC_RUN_ID": "none"})  # torchrun's default rdzv id names no launch
    assert own.startswith("pid-") and own == launch_id({})


def test_per_rank_directory_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    cache = make(tmp_path, per_rank=True)
    assert cache.path == tmp_path / "cache" / "rank2"
    cache.put("aa", b"x", wait=True)
    assert (tmp_path / "cache" / "rank2" / "entries" / "aa" / "aa.rcp").exists()


def test_directory_is_created_private(tmp_path):
    cache = make(tmp_path)
    assert (cache.path.stat().st_mode & 0o777) == 0o700
