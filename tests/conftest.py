"""Shared fixtures: a private recipe cache per test session, a fresh Dynamo per test, model loading."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"

# A suite started in the background of a shell inherits SIGINT ignored, and so would every process a test starts:
# the tests that press Ctrl-C on a run or a warm-up would wait for nothing. As at a terminal, SIGINT interrupts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The longest tests (each over ~10 s on 2 cores) run first, longest first, so that with ``-n 2`` neither worker
# is left finishing one of them alone at the end (longest-first scheduling); the rest keep the collection's order.
LONG_FIRST = ("test_opinfo.py", "test_programs.py::test_a_warm_cache", "test_fleet.py::test_ci_warms",
              "test_recipecache_multiprocess.py::test_stress", "test_model_causes.py::test_a_library_custom_op",
              "test_shapes.py::test_second_process", "test_shapes.py::test_keys_are_stable", "test_ddp.py",
              "test_fabric.py", "test_gaudi_scripts.py", "test_cli_gpt.py", "test_fleet.py::test_host_b",
              "test_lazy_mode.py::test_a_second")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, part in enumerate(LONG_FIRST) if part in item.nodeid), len(LONG_FIRST))
    items.sort(key=rank)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep every test away from the user's cache directory."""
    path = tmp_path_factory.mktemp("recipes")
    old = os.environ.get("PT_HPU_RECIPE_CACHE_CONFIG")
    os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] = f"{path},false,1024"
    yield path
    if old is None:
        os.environ.pop("PT_HPU_RECIPE_CACHE_CONFIG", None)
    else:
        os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_config(tmp_path_factory):
    """Keep every test away from the user's config directory (this machine's signing key lives there); a test of
    the key itself points XDG_CONFIG_HOME at a directory of its own."""
    path = tmp_path_factory.mktemp("config")
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(path)
    yield path
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(autouse=True, scope="session")
def _no_guard_latency_probe():
    """Dynamo times every new guard set once, after flushing the CPU caches, for a debug log line and a
    compile metric nothing here reads: about 25 ms of CPU (and more of wall time) per compiled graph, the
    suite compiles thousands. The guards themselves are built and checked as before."""
    import torch._dynamo.guards as guards

    saved = guards.profile_guard_manager
    guards.profile_guard_manager = lambda *args: 0.0
    yield
    guards.profile_guard_manager = saved


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _device_context():
    """Each test that finds the hpu device enabled (its module enables it at import: torch needs the device before
    the process's first backward) runs on a device context of its own, the device enabled in the same mode:
    memory, lazy graphs, the step ledger and the timeline start empty, and the process's context comes back
    after the test, whatever the test switched."""
    import hpu_backend.device as hd
    from hpu_backend.device import context
    from hpu_backend.settings import Settings

    device = context.enabled_device()
    if device is None or device.settings != Settings.from_options({}):  # a test's own settings: left as they are
        yield
        return
    with context.fresh_context():
        hd.enable(device.mode)
        yield


@pytest.fixture(params=["eager", "lazy"])
def device_mode(request):
    """The hpu device in each of its modes, on the test's own device context."""
    import hpu_backend.device as hd

    hd.enable(request.param)
    yield request.param
    hd.enable("eager")


def load_model_file(name: str):
    """Import models/<name>.py as a module (model files are plain scripts, not a package)."""
    path = MODELS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"hpu_models_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_python(code: str, env: dict | None = None, timeout: int = 300) -> str:
    """Run code in a fresh interpreter; return stdout, fail the test with stderr on error."""
    import subprocess

    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


REDIS = shutil.which("redis-server")


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(workers: Path, world: int, *args: str, timeout: int = 300) -> list[dict]:
    """Run ``workers`` as ``world`` real processes (rank, world, a free port, args), each printing its JSON
    result on its last line; fail with a rank's stderr if it fails."""
    import json

    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(workers), str(rank), str(world), str(port), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.fixture
def no_gc_pause():
    """The cyclic collector off for one test: the fleet tier gives each server call a 1 s deadline, and a full
    collection of a test worker's heap (over a million objects once the OpInfo tests have run) can alone take
    a second; that pause is the test process's, not the server's. Collection resumes after the test."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


@pytest.fixture
def redis_server(tmp_path, no_gc_pause):
    """(url, process, client) of a private redis-server on a free loopback port; stopped afterwards."""
    if REDIS is None:
        pytest.skip("needs redis-server (.ci/run installs it: apt-get install redis-server)")
    import redis

    port = free_port()
    proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0", proc, client
    proc.kill()
    proc.wait(5)
