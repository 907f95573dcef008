"""Relocation keeps every hit: a cache filled by one process serves a second process with 100% hits and no compile
when the cache was moved to another directory, or the second process has another HOME, host name, user, rank
(RANK / LOCAL_RANK) or start time. Each second process is a real one; what it cannot change for real (the host
name, the user, the clock) it is told by the calls that report them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)

CHILD = r"""
import json, os, sys
if os.environ.get("FAKE_HOST"):  # what another machine reports (the names a cache could have read)
    import platform, socket
    socket.gethostname = lambda: os.environ["FAKE_HOST"]
    platform.node = lambda: os.environ["FAKE_HOST"]
if os.environ.get("FAKE_USER"):
    import getpass
    getpass.getuser = lambda: os.environ["FAKE_USER"]
if os.environ.get("CLOCK_OFFSET_S"):  # a process started a day later
    import time
    _time, _time_ns, offset = time.time, time.time_ns, float(os.environ["CLOCK_OFFSET_S"])
    time.time = lambda: _time() + offset
    time.time_ns = lambda: _time_ns() + int(offset * 1e9)
import torch
from hpu_backend.metrics import metric_global

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
options = {"cache_config": sys.argv[1] + ",false,64"}
compiled = torch.compile(model, backend="hpu_backend", dynamic=False, options=options)
x = torch.randn(4, 6)
loss = compiled(x).square().sum()
loss.backward()
with torch.no_grad():
    out = compiled(x)
torch.testing.assert_close(out, model(x))
cache = dict(metric_global("recipe_cache").stats())
print(json.dumps({"program_hits": cache["ProgramHit"], "program_misses": cache["ProgramMiss"],
                  "recipe_hits": cache["TotalHit"], "recipe_misses": cache["TotalMiss"],
                  "compiled": dict(metric_global("graph_compilation").stats())["TotalNumber"]}))
"""


def _run(cache, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(cache)], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def _filled_once(tmp_path_factory):
    """One first process fills a cache (a real process each: relocation tests are slow enough without refills)."""
    root = tmp_path_factory.mktemp("relocation")
    first = _run(root / "cache", HOME=str(root / "home-a"))
    assert first["program_misses"] == 2 and first["recipe_misses"] > 0 and first["compiled"] > 0, first
    return root / "cache"


@pytest.fixture
def filled(_filled_once, tmp_path):
    """A copy of the filled cache for one test (what a second process reads, and writes its stats to)."""
    shutil.copytree(_filled_once, tmp_path / "cache")
    return tmp_path / "cache"


def _all_hits(stats: dict) -> None:
    assert stats["program_misses"] == 0 and stats["recipe_misses"] == 0 and stats["compiled"] == 0, stats
    assert stats["program_hits"] == 2 and stats["recipe_hits"] > 0, stats


def test_a_cache_moved_to_another_directory_keeps_every_hit(filled, tmp_path):
    moved = tmp_path / "elsewhere" / "recipes"
    moved.parent.mkdir()
    shutil.move(str(filled), str(moved))
    _all_hits(_run(moved, HOME=str(tmp_path / "home-a")))


def test_another_home_keeps_every_hit(filled, tmp_path):
    _all_hits(_run(filled, HOME=str(tmp_path / "home-b"), XDG_CACHE_HOME=str(tmp_path / "xdg")))


def test_another_host_name_keeps_every_hit(filled, tmp_path):
    _all_hits(_run(filled, HOME=str(tmp_path / "home-a"), FAKE_HOST="another-host.example", HOSTNAME="another-host"))


def test_another_user_keeps_every_hit(filled, tmp_path):
    _all_hits(_run(filled, HOME=str(tmp_path / "home-a"), FAKE_USER="someone-else", USER="someone-else",
                   LOGNAME="someone-else"))


def test_another_rank_and_local_rank_keep_every_hit(filled, tmp_path):
    _all_hits(_run(filled, HOME=str(tmp_path / "home-a"), RANK="3", LOCAL_RANK="5", WORLD_SIZE="8"))


def test_another_process_start_time_keeps_every_hit(filled, tmp_path):
    _all_hits(_run(filled, HOME=str(tmp_path / "home-a"), CLOCK_OFFSET_S=str(86400.0)))
