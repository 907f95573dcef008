"""Real processes sharing one cache directory: a stress run with a SIGKILLed writer, and delete_on_start."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipecache import CacheConfig, RecipeCache, decode_entry
from recipecache.eviction import EvictionLog

sys.path.insert(0, str(Path(__file__).parent))
from recipecache_workers import key_for, payload_for  # noqa: E402

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)

WORKERS = Path(__file__).parent / "recipecache_workers.py"
ROOT = Path(__file__).resolve().parents[1]


def spawn(role: str, env_extra: dict | None = None, **args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.Popen([sys.executable, str(WORKERS), role, json.dumps(args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_progress(path: Path, at_least: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_text().split()) >= at_least:
            return
        time.sleep(0.01)  # waiting on a condition, not ordering anything
    raise AssertionError(f"writer made no progress (exit {proc.poll()}): {proc.stderr.read() if proc.poll() else ''}")


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err}"
    assert "Traceback" not in err and "ERROR" not in err, err
    return out


def test_stress_writers_readers_and_a_killed_writer(tmp_path):
    writers, count, limit_mb = 8, 300, 4
    path = str(tmp_path / "cache")
    common = dict(path=path, limit_mb=limit_mb, count=count)
    progress = tmp_path / "victim.progress"
    victim = spawn("writer", writer=0, wait=True, progress=str(progress), **common)
    survivors = [spawn("writer", writer=w, wait=w % 2 == 0, **common) for w in range(1, writers)]
    readers = [spawn("reader", seed=s, reads=1500, writers=writers, **common) for s in range(2)]
    wait_for_progress(progress, 60, victim)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    for proc in survivors:
        finish(proc)
    reader_hits = [json.loads(finish(proc))["hits"] for proc in readers]

    cache = RecipeCache(CacheConfig(path=path, max_size_mb=limit_mb, memory_entries=0))
    files = [p for p in (cache.path / "entries").rglob("*") if p.is_file()]
    entries = [p for p in files if p.suffix == ".rcp"]
    # Within the limit, by a real scan rather than the ledger.
    assert 0 < sum(p.stat().st_size for p in entries) <= limit_mb * 2**20
    # And the whole directory, bookkeeping included (the killed writer's temp file aside).
    everything = [p for p in cache.path.rglob("*") if p.is_file() and p.suffix != ".tmp"]
    assert sum(p.stat().st_size for p in everything) <= limit_mb * 2**20
    assert cache.total_bytes() >= sum(p.stat().st_size for p in entries)  # the ledger may only over-count
    # Every visible entry is whole and holds exactly what was put.
    for p in entries:
        entry = decode_entry(p.read_bytes())
        assert entry.key == p.stem and entry.payload == payload_for(entry.key)
    assert cache.verify() == []
    # Temp files are never listed; only the killed writer may have left one behind.
    assert all(not i.key.startswith(".") for i in cache.entries())
    assert {p.name.split(".")[2] for p in files if p.suffix == ".tmp"} <= {str(victim.pid)}
    # Every key that was put is readable or accounted for by the eviction log.
    evicted = EvictionLog(cache.path / "evictions.log").keys()
    done = len(progress.read_text().split())
    expected = [key_for(w, i) for w in range(1, writers) for i in range(count)] + [key_for(0, i) for i in range(done)]
    missing = [k for k in expected if k not in evicted and cache.get(k) != payload_for(k)]
    assert missing == []
    assert sum(reader_hits) > 0
    stats = cache.stats()
    assert stats["evictions"] > 0 and stats["bytes_written"] > limit_mb * 2**20


def test_delete_on_start_with_concurrent_starters_clears_once(tmp_path):
    path = str(tmp_path / "cache")
    seed = RecipeCache(CacheConfig(path=path, fsync=False))
    seed.put("stale0", b"from an earlier run", wait=True)
    launch = {"HPU_RECIPE_CACHE_LAUNCH_ID": "test-launch"}  # as torchrun or mpirun name one launch
    procs = [spawn("starter", launch, writer=w, count=20, path=path, limit_mb=64, fsync=False, delete_on_start=True)
             for w in range(4)]
    for proc in procs:
        finish(proc)
    cache = RecipeCache(CacheConfig(path=path, memory_entries=0))
    assert cache.get("stale0") is None
    lost = [key_for(w, i) for w in range(4) for i in range(20) if cache.get(key_for(w, i)) is None]
    assert lost == []
