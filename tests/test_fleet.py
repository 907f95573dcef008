"""The fleet tier against a real redis-server, started here on a free loopback port (no mocks)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipecache import CacheConfig, RecipeCache, encode_entry

from cli_helpers import cli, cli_json, tiny_model
from conftest import free_port

REDIS = shutil.which("redis-server")
pytestmark = [pytest.mark.e2e,  # the end-to-end tier (the e2e marker in pyproject.toml)
              pytest.mark.skipif(REDIS is None, reason="needs redis-server (.ci/run installs it: apt-get install "
                                                       "redis-server)")]
ROOT = Path(__file__).resolve().parents[1]


def _cache(path, url, **kwargs) -> RecipeCache:
    return RecipeCache(CacheConfig(path=path, fsync=False, memory_entries=0, remote=url, **kwargs))


def _hpurecipe(*args, env_extra: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "hpurecipe.main", *map(str, args), "--json"], capture_output=True,
                          text=True, env=dict(os.environ, **env_extra), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_host_b_compiles_nothing_after_host_a_warmed(tmp_path, redis_server):
    url, _, client = redis_server
    model = tiny_model(tmp_path)
    env = {"HPU_RECIPE_CACHE_REMOTE": url}
    a = _hpurecipe("warm", model, "-d", tmp_path / "host-a", env_extra=env)
    assert a["compiled"] > 0 and client.dbsize() >= a["recipes"]
    b = _hpurecipe("warm", model, "-d", tmp_path / "host-b", "--check", env_extra=env)  # a separate process and disk
    assert (b["compiled"], b["mismatches"]) == (0, 0) and b["recipes"] == a["recipes"]
    local = _hpurecipe("ls", "-d", tmp_path / "host-b", env_extra={"HPU_RECIPE_CACHE_REMOTE": "none"})
    assert len(local) == client.dbsize() - 1  # remote hits were written back to host B's disk (1: the manifest)
    assert client.exists(*client.keys("*:doc:tiny.inference.json")) == 1
    assert _hpurecipe("stats", "-d", tmp_path / "host-b", env_extra=env)["remote_hits"] > 0


def test_a_server_killed_mid_run_costs_one_warning_and_a_bounded_wait(tmp_path, redis_server, caplog):
    url, proc, client = redis_server
    cache = _cache(tmp_path / "c", url)
    cache.put("before", b"stored while the server was up", wait=True)
    assert client.exists("hpu_recipes:before") == 1
    proc.kill()
    proc.wait(5)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, "recipecache"):
        for i in range(50):
            assert cache.get(f"k{i}") is None
        cache.put("after", b"local still works", wait=True)
    assert time.perf_counter() - start < 2.0
    assert cache.get("after") == b"local still works" and cache.get("before") == b"stored while the server was up"
    assert caplog.text.count("remote tier") == 1


def test_a_damaged_remote_entry_is_a_miss_and_is_deleted(tmp_path, redis_server):
    url, _, client = redis_server
    _cache(tmp_path / "a", url).put("aa", b"x" * 100, wait=True)
    (name,) = client.keys("hpu_recipes:*")
    data = bytearray(client.get(name))
    data[40] ^= 0x01
    client.set(name, bytes(data))
    other = _cache(tmp_path / "b", url)
    assert other.get("aa") is None and other.stats()["corrupt"] == 1
    assert client.exists(name) == 0


def test_entries_expire_and_the_ttl_is_set(tmp_path, redis_server):
    url, _, client = redis_server
    _cache(tmp_path / "a", url, remote_ttl_s=3600).put("aa", b"x", wait=True)
    assert 0 < client.ttl(b"hpu_recipes:aa") <= 3600
    _cache(tmp_path / "b", url, remote_ttl_s=1).put("bb", b"y", wait=True)
    time.sleep(2.1)
    assert client.exists(b"hpu_recipes:bb") == 0 and _cache(tmp_path / "c", url).get("bb") is None


PUSHER = """
import sys
from recipecache import CacheConfig, RecipeCache
path, url, w = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache = RecipeCache(CacheConfig(path=path, fsync=False, remote=url))
for i in range(20):
    cache.put(f"w{w}k{i:02d}", f"payload {w} {i}".encode() * 50)
cache.flush()
"""


def test_concurrent_pushes_from_four_processes(tmp_path, redis_server):
    url, _, client = redis_server
    procs = [subprocess.Popen([sys.executable, "-c", PUSHER, str(tmp_path / f"h{w}"), url, str(w)],
                              env=dict(os.environ, PYTHONPATH=str(ROOT))) for w in range(4)]
    assert [p.wait(120) for p in procs] == [0] * 4
    fresh = _cache(tmp_path / "fresh", url)
    for w in range(4):
        for i in range(20):
            assert fresh.get(f"w{w}k{i:02d}") == f"payload {w} {i}".encode() * 50
    assert client.dbsize() == 80


def test_entries_on_the_server_are_the_disk_format(tmp_path, redis_server):
    url, _, client = redis_server
    cache = _cache(tmp_path / "a", url)
    cache.put("aa", b"same bytes", {"model": "m"}, wait=True)
    entry = cache.peek("aa")
    assert client.get("hpu_recipes:aa") == encode_entry("aa", b"same bytes", {"model": "m"}, entry.created)


def test_ci_warms_and_pushes_a_fresh_host_pulls_what_its_buckets_need(tmp_path, redis_server):
    url, _, client = redis_server
    model = tiny_model(tmp_path)
    local_only = {"HPU_RECIPE_CACHE_REMOTE": "none"}
    _hpurecipe("warm", model, "-d", tmp_path / "ci", env_extra=local_only)
    doc = _hpurecipe("push", "-d", tmp_path / "ci", "--remote", url, env_extra=local_only)
    pushed = doc["pushed"]
    assert pushed > 0 and doc["manifests"] == 1 and client.dbsize() == pushed + 1  # the entries and the manifest
    stats = _hpurecipe("stats", "-d", tmp_path / "ci", "--remote", url, env_extra=local_only)  # as push and pull
    assert stats["remote"]["entries"] == pushed and stats["remote"]["bytes"] > 0
    with pytest.MonkeyPatch.context() as env:  # or from the environment, in-process
        env.setenv("HPU_RECIPE_CACHE_REMOTE", url)
        assert cli_json("stats", "-d", tmp_path / "ci")["remote"] == stats["remote"]
    pulled = _hpurecipe("pull", model, "-d", tmp_path / "host", "--remote", url, env_extra=local_only)
    assert pulled["missing"] == [] and pulled["pulled"] == pulled["needed"] > 0
    assert _hpurecipe("warm", model, "-d", tmp_path / "host", env_extra=local_only)["compiled"] == 0
    client.delete(*client.keys("*:doc:*"))  # without the manifest, pull learns the keys by compiling
    again = _hpurecipe("pull", model, "-d", tmp_path / "host2", "--remote", url, env_extra=local_only)
    assert again["missing"] == [] and again["needed"] == pulled["needed"]


def test_fleet_commands_with_the_server_down_say_it_is_unreachable(tmp_path, redis_server):
    url, proc, _ = redis_server
    model = tiny_model(tmp_path)
    cli("warm", model, "-d", tmp_path / "ci")
    proc.kill()
    proc.wait(5)
    closed = f"redis://127.0.0.1:{free_port()}/0"
    for down in (url, closed):  # a server that died, and a port nothing listens on
        for args in (["pull", model, "-d", tmp_path / "host"], ["push", "-d", tmp_path / "ci"],
                     ["stats", "-d", tmp_path / "ci"]):
            out = cli(*args, "--remote", down, code=1).output
            assert "server unreachable" in out and "missing" not in out, (args, out)


def test_the_tier_is_retried_after_its_back_off_not_on_every_call(tmp_path, redis_server):
    from recipecache.remote import RETRY_AFTER_S, RemoteTier

    url, proc, _ = redis_server
    now = [0.0]
    tier = RemoteTier(url, ttl_s=60, clock=lambda: now[0])
    assert tier.put("aa", b"x") and tier.get("aa") == b"x"
    proc.kill()
    proc.wait(5)
    assert tier.get("aa") is None and not tier.available  # one failed call, then it stays off
    port = url.rsplit(":", 1)[1].split("/")[0]
    again = subprocess.Popen([REDIS, "--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
                             stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        assert tier.get("aa") is None  # still backing off: not even asked
        now[0] += RETRY_AFTER_S + 1
        assert tier.put("aa", b"y") and tier.get("aa") == b"y"
    finally:
        again.kill()
        again.wait(5)
