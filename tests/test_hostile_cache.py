"""Hostile input to the cache, its bookkeeping files, bundles and the fleet tier: each case builds the crafted
input, shows the one-line outcome, that nothing outside the cache changed, and that time and memory stay
bounded (CLI cases run in a fresh process under a timeout, memory cases under an address-space limit)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import os
import pwd
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hpu_backend.formats.program import Contract, Program, ProgramGraph
from hpu_backend.formats.recipe import Recipe, ValueSpec
from recipecache import CacheConfig, CacheError, RecipeCache, encode_entry
from typer.testing import CliRunner

from hpurecipe.main import app
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
REDIS = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS is None, reason="needs redis-server")
KEY_ENV = "HPURECIPE_BUNDLE_KEY"


# -- helpers ----------------------------------------------------------------------------------------------------

def recipe_bytes(name: str = "g", **fields) -> bytes:
    """A minimal recipe payload that passes every check (no torch needed)."""
    fields = {"target": "gaudi2", "inputs": [], "input_names": [], "nodes": [], "outputs": [], **fields}
    return Recipe(name=name, kind="inference", **fields).to_bytes()


def program_bytes(guards: list) -> bytes:
    template = Recipe(name="g", kind="inference", target="gaudi2", inputs=[ValueSpec("sym", expr="s0")],
                      input_names=["x"], nodes=[], outputs=[], symbols=["s0"], symbol_sources=[[0, -1]])
    return Program("inference", [ProgramGraph(template, {}, {})], Contract(num_inputs=1), ["s0"], [[0, -1]],
                   guards).to_bytes()


def make_cache(path: Path, **kwargs) -> RecipeCache:
    return RecipeCache(CacheConfig(path=path, fsync=False, memory_entries=0, **kwargs))


@pytest.fixture
def filled(tmp_path) -> Path:
    """A cache with two valid recipes (``aa01``, ``bb02``), and an ``outside`` directory beside it."""
    cache = make_cache(tmp_path / "cache")
    cache.put("aa01", recipe_bytes("a"), {"model": "m"}, wait=True)
    cache.put("bb02", recipe_bytes("b"), {"model": "m"}, wait=True)
    cache.flush()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "target").write_bytes(b"precious")
    return tmp_path / "cache"


def snapshot(directory: Path) -> dict:
    """Every path under directory with its type, size and content hash (to show nothing changed)."""
    found = {}
    for p in sorted(Path(directory).rglob("*")):
        st = os.lstat(p)
        found[str(p)] = (stat.S_IFMT(st.st_mode), st.st_size,
                         p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return found


def cli_in(*args, code: int | None = 0, says: str = ""):
    """hpurecipe in this process (for cases that cannot hang); with a failing ``code``, its one error line."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert code is None or result.exit_code == code, (args, result.exit_code, result.output, result.exception)
    if code:
        one_line({"code": code, "stderr": result.stderr, "bug": None}, says, code)
    return result


RUNNER = """
import json, resource, sys
limit = int(sys.argv[3])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from typer.testing import CliRunner
from hpurecipe.main import app
out = []
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, args)
    bug = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
    out.append({"code": r.exit_code, "stderr": r.stderr.strip(), "bug": repr(bug) if bug else None})
exec(sys.argv[2])
print(json.dumps(out))
"""


def in_fresh_process(commands: list, then: str = "", timeout: float = 30, limit_as: int = 0,
                     argv: tuple = ()) -> list[dict]:
    """Run hpurecipe ``commands`` (then the Python ``then``, which sees ``argv`` from sys.argv[4]) in one
    fresh process under a timeout and an address-space limit: a hang or a runaway allocation fails the
    test instead of the machine. Returns {code, stderr, bug} per command."""
    args = json.dumps([[str(a) for a in c] for c in commands])
    proc = subprocess.run([sys.executable, "-c", RUNNER, args, then, str(limit_as), *map(str, argv)],
                          capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ,
                                                                         PYTHONPATH=f"{ROOT}:{ROOT / 'cli'}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for command, result in zip(commands, results):
        assert result["bug"] is None and "Traceback" not in result["stderr"], (command, result)
    return results


def one_line(result: dict, says: str = "", code: int = 1) -> None:
    """The command failed with one error line saying ``says`` (after at most one warning), no traceback."""
    err = " ".join(result["stderr"].split())  # long lines are wrapped to the terminal
    assert result["code"] == code and err.count("error:") == 1 and "Traceback" not in err, result
    assert err[:err.index("error:")].count("recipe cache") <= 1, result  # one warning at most before it
    assert says.lower() in err[err.index("error:"):].lower(), result


# -- bookkeeping files: FIFOs, devices, links, huge files (items 6, 9) ---------------------------------------------

BOOKKEEPING = ["size.json", "stats.json", "hits.log", "config.json", "evictions.log", "clear.marker",
               "eviction.lock", "stats.lock", "manifests/m.inference.json"]

SERVE_AND_ADMIN = """
from recipecache import CacheConfig, CacheError, RecipeCache
c = RecipeCache(CacheConfig.parse(sys.argv[4] + ",true,1", fsync=False))
c.put("cc03", b"x" * 100, {"model": "m"}, wait=True)
assert c.get("cc03") == b"x" * 100
c.flush(); c.stats(); c.entries(); c.verify()
for admin in (lambda: c.evict(max_bytes=0), c.clear):
    try:
        admin()
    except CacheError:  # a lock file that is no regular file: refused in one line, never waited on
        pass
"""


@pytest.mark.e2e
def test_fifos_in_place_of_every_bookkeeping_file_hang_nothing(filled, tmp_path):
    for name in BOOKKEEPING:
        (filled / name).parent.mkdir(exist_ok=True)
        (filled / name).unlink(missing_ok=True)
        os.mkfifo(filled / name)
    commands = [["stats", "-d", filled], ["ls", "-d", filled], ["verify", "-d", filled],
                ["export", tmp_path / "b.tar", "-d", filled], ["evict", "--max-size", "1", "--yes", "-d", filled]]
    start = time.perf_counter()
    results = in_fresh_process(commands, SERVE_AND_ADMIN, argv=[filled])
    assert time.perf_counter() - start < 20
    assert [r["code"] for r in results[:3]] == [0, 0, 0], results
    for result in results[3:]:  # export reads the manifests; evict takes the lock: each fails in one line
        assert result["code"] == 0 or one_line(result) is None, result


@pytest.mark.e2e
def test_links_to_devices_and_huge_files_are_not_read(filled, tmp_path):
    names = ["size.json", "stats.json", "hits.log", "config.json", "clear.marker", "evictions.log"]
    huge = tmp_path / "outside" / "huge"
    with open(huge, "wb") as f:
        f.truncate(2 * 1024**3)  # sparse: reading it whole would take 2 GB
    for name in names[:3]:
        (filled / name).unlink(missing_ok=True)
        (filled / name).symlink_to("/dev/zero")
    for name in names[3:]:
        (filled / name).unlink(missing_ok=True)
        (filled / name).symlink_to(huge)
    (filled / "manifests").mkdir()
    with open(filled / "manifests" / "m.inference.json", "wb") as f:
        f.truncate(2 * 1024**3)  # a huge regular file in place: refused by its size, never read
    results = in_fresh_process([["stats", "--json", "-d", filled], ["ls", "--json", "-d", filled],
                                ["export", tmp_path / "b.tar", "-d", filled]], limit_as=1024**3)
    assert [r["code"] for r in results] == [0, 0, 0], results


@pytest.mark.parametrize("link", ["symbolic", "hard"])
@pytest.mark.parametrize("name", ["evictions.log", "hits.log", "eviction.lock", "stats.lock", "size.json",
                                  "stats.json"])
def test_logs_and_locks_are_never_written_through_a_link(filled, name, link):
    outside = filled.parent / "outside"
    before = snapshot(outside)
    (filled / name).unlink(missing_ok=True)
    if link == "symbolic":
        (filled / name).symlink_to(outside / "target")
    else:
        os.link(outside / "target", filled / name)
    cache = make_cache(filled)
    assert cache.get("aa01") is not None  # a hit: hits.log is appended on flush
    cache.flush()
    with contextlib.suppress(CacheError):  # a lock that is a link: the removal is refused in one line
        cache.evict(keys=["aa01"])  # a removal: evictions.log is appended under eviction.lock
    cache.put("cc03", b"x", wait=True)
    assert snapshot(outside) == before
    if name.endswith(".log") and link == "hard":  # the log was replaced by a private file, and still counts
        assert os.stat(filled / name).st_nlink == 1 and b"aa01" in (filled / name).read_bytes()


def test_every_bookkeeping_file_hard_linked_outside_is_never_written(filled, tmp_path):
    """Each bookkeeping file is a second name of a file outside the cache: serving, flushing stats and every
    command that changes the directory leave the outside files as they were."""
    outside = tmp_path / "outside"
    for i, name in enumerate(BOOKKEEPING):
        (filled / name).parent.mkdir(exist_ok=True)
        (filled / name).unlink(missing_ok=True)
        (outside / f"f{i}").write_bytes(b"precious %d\n" % i)
        os.link(outside / f"f{i}", filled / name)
    before = snapshot(outside)
    cache = make_cache(filled)
    assert cache.get("aa01") == recipe_bytes("a")
    cache.put("cc03", b"x" * 100, {"model": "m"}, wait=True)
    cache.flush()
    for args in (["stats"], ["ls"], ["verify"], ["evict", "--max-size", "1", "--yes"], ["clear", "--yes"],
                 ["stats", "--zero"]):
        result = cli_in(*args, "-d", filled, code=None)
        assert result.exit_code in (0, 1) and "Traceback" not in result.output, (args, result.output)
    assert snapshot(outside) == before


def test_an_entry_with_a_hard_link_outside_is_served_but_never_touched(filled, tmp_path):
    cache = make_cache(filled)
    path = cache._disk.entry_path("aa01")
    os.link(path, tmp_path / "outside" / "aa01.copy")
    os.utime(path, (1, 1))  # an old last use: a hit would record the new one
    assert cache.get("aa01") == recipe_bytes("a")
    cache.flush()
    assert os.stat(tmp_path / "outside" / "aa01.copy").st_mtime == 1


def test_a_linked_manifests_directory_is_never_written_or_read(filled, tmp_path):
    bundle = tmp_path / "b.tar"
    cli_in("export", bundle, "-d", filled)
    outside = tmp_path / "outside"
    target = tmp_path / "other-cache"
    make_cache(target).flush()
    (target / "manifests").symlink_to(outside, target_is_directory=True)
    (outside / "planted.json").write_text('{"model": "x", "mode": "inference", "buckets": {}}')
    before = snapshot(outside)
    with tarfile.open(bundle, "a") as tar:  # add a manifest member to import
        data = b'{"model": "m", "mode": "inference", "buckets": {"b=2": ["aa01"]}}'
        info = tarfile.TarInfo("manifests/m.inference.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cli_in("import", bundle, "-d", target, code=1, says="not a directory")
    assert snapshot(outside) == before
    out = json.loads(cli_in("export", tmp_path / "again.tar", "--json", "-d", target).stdout)
    assert out["manifests"] == []  # the planted manifest is not read


# -- read-only commands change nothing (item 10) ---------------------------------------------------------------

def test_inspection_of_a_directory_without_a_cache_creates_nothing(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    before = snapshot(plain)
    for args in (["stats"], ["ls"], ["verify"], ["stats", "--json"]):
        cli_in(*args, "-d", plain)
    for args in (["clear", "--yes"], ["evict", "--yes"], ["export", tmp_path / "x.tar"], ["show", "aa"]):
        cli_in(*args, "-d", plain, code=1, says="no recipe cache")
    assert snapshot(plain) == before


def test_inspection_never_records_or_applies_another_limit(filled, monkeypatch):
    before = snapshot(filled)
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{filled},false,0.0001")
    for args in (["ls"], ["stats"], ["verify"], ["show", "aa01"], ["explain", "aa01", "bb02"]):
        cli_in(*args, "--json")
    assert snapshot(filled) == before  # config.json keeps its limit, no entry trimmed, nothing written


# -- export destinations (item 11) -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "link"])
def test_export_never_replaces_what_is_not_a_regular_file(filled, tmp_path, kind):
    dest = tmp_path / "dest"
    if kind == "device":
        os.mknod(dest, stat.S_IFCHR | 0o600, os.makedev(1, 7))  # a /dev/full of our own
    elif kind == "fifo":
        os.mkfifo(dest)
    elif kind == "directory":
        dest.mkdir()
    else:
        dest.symlink_to(tmp_path / "outside" / "target")
    before = snapshot(tmp_path / "outside")
    mode = os.lstat(dest).st_mode
    cli_in("export", dest, "-d", filled, code=1, says="not a regular file")
    assert os.lstat(dest).st_mode == mode and snapshot(tmp_path / "outside") == before


def test_export_writes_no_temp_file_through_a_planted_link(filled, tmp_path):
    (tmp_path / ".b.tar.tmp").symlink_to(tmp_path / "outside" / "target")
    before = snapshot(tmp_path / "outside")
    cli_in("export", tmp_path / "b.tar", "-d", filled)
    assert snapshot(tmp_path / "outside") == before and tarfile.is_tarfile(tmp_path / "b.tar")


# -- bundles: FIFOs, devices, decompression bombs (items 6, 7) ---------------------------------------------------

@pytest.mark.e2e
def test_import_of_a_fifo_a_device_or_a_directory_fails_at_once(tmp_path):
    fifo = tmp_path / "bundle.tar"
    os.mkfifo(fifo)
    start = time.perf_counter()
    results = in_fresh_process([["import", source, "-d", tmp_path / "c"] for source in (fifo, "/dev/zero", tmp_path)])
    assert time.perf_counter() - start < 20 and not (tmp_path / "c").exists()
    for result in results:
        one_line(result, says="not a regular file")


def _bomb(path: Path, members: int, member_bytes: int, name_of) -> None:
    """A gzip bundle of ``members`` members of zeros, as concatenated gzip streams: the zeros are compressed
    once, so a bundle that inflates to gigabytes is built in a moment."""
    zeros = gzip.compress(b"\0" * member_bytes, compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        for i in range(members):
            info = tarfile.TarInfo(name_of(i))
            info.size = member_bytes
            f.write(gzip.compress(info.tobuf(format=tarfile.USTAR_FORMAT), mtime=0))
            f.write(zeros)
        f.write(gzip.compress(b"\0" * 1024, mtime=0))


@pytest.mark.e2e
def test_gzip_bomb_bundles_are_refused_quickly_in_bounded_memory(tmp_path):
    bombs = {"entries": (256, 16 * 1024**2, lambda i: f"entries/k{i:04d}.rcp", "not a cache entry"),  # 4 GB
             "manifests": (64, 16 * 1024**2 - 1024, lambda i: f"manifests/m{i}.json", "not JSON"),
             "names": (16, 60 * 1024**2, lambda i: f"payload/{i}.bin", "unexpected member")}
    for name, (members, size, name_of, _) in bombs.items():
        _bomb(tmp_path / f"{name}.tar.gz", members, size, name_of)
        assert (tmp_path / f"{name}.tar.gz").stat().st_size < 8 * 1024**2
    start = time.perf_counter()
    results = in_fresh_process([["import", tmp_path / f"{name}.tar.gz", "-d", tmp_path / "c"] for name in bombs],
                               limit_as=1024**3)
    assert time.perf_counter() - start < 20 and not (tmp_path / "c").exists()
    for result, (*_, says) in zip(results, bombs.values()):
        one_line(result, says=says)


# -- one unreadable shard (item 12) ------------------------------------------------------------------------------

def _as_nobody(run) -> None:
    """``run(base, nobody)`` in a fresh directory traversable by ``nobody`` (root reads everything, so a cache
    is made unreadable to another user; the test is skipped unless we are root and ``nobody`` exists)."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to drop to")
    if os.getuid() != 0:
        pytest.skip("needs root to run the cache as another user")
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(base, 0o711)  # traversable by nobody
        run(base, nobody)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _seeded_for(nobody, cache_dir: Path, keys=("aa01", "bb02")) -> None:
    seed = make_cache(cache_dir)
    for key in keys:
        seed.put(key, recipe_bytes(key), wait=True)
    seed.flush()
    for p in [cache_dir, *cache_dir.rglob("*")]:
        os.lchown(p, nobody.pw_uid, nobody.pw_gid)


def _child_as(nobody, work) -> dict:
    """``work()`` (a JSON-able dict) in a forked child running as ``nobody``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        report = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    return report


@pytest.mark.e2e
def test_an_unreadable_shard_is_skipped_reported_and_verify_goes_on():
    _as_nobody(_unreadable_shard)


def _unreadable_shard(base: Path, nobody) -> None:
    cache_dir = base / "cache"
    _seeded_for(nobody, cache_dir)
    os.chmod(cache_dir / "entries" / "aa", 0o000)

    def work():
        cache = make_cache(cache_dir)
        return {"verify": cache.verify(), "keys": cache.keys(), "entries": [i.key for i in cache.entries()],
                "enabled": cache.enabled, "get": cache.get("bb02") == recipe_bytes("bb02")}

    report = _child_as(nobody, work)
    assert report["enabled"] and report["get"] and report["keys"] == report["entries"] == ["bb02"], report
    assert [reason.split(" (")[0] for _, reason in report["verify"]] == ["unreadable shard directory"], report


@pytest.mark.e2e
def test_one_unreadable_entry_is_reported_and_verify_goes_on():
    _as_nobody(_unreadable_entry)


def _unreadable_entry(base: Path, nobody) -> None:
    cache_dir = base / "cache"
    _seeded_for(nobody, cache_dir, ("aa01", "bb02", "cc03"))
    os.chmod(cache_dir / "entries" / "aa" / "aa01.rcp", 0o000)
    (cache_dir / "entries" / "cc" / "cc03.rcp").write_bytes(b"damaged")

    def work():
        try:
            return {"verify": make_cache(cache_dir).verify()}
        except Exception as exc:  # reported to the parent, which fails the test with it
            return {"error": repr(exc)}

    report = _child_as(nobody, work)
    assert sorted(name for name, _ in report.get("verify", [])) == ["aa01", "cc03"], report
    assert dict(report["verify"])["aa01"].startswith("unreadable"), report


def test_verify_fix_survives_a_foreign_file_with_a_250_character_name(filled):
    long_name = filled / "entries" / "aa" / ("x" * 250)
    long_name.write_bytes(b"foreign")
    damaged = filled / "entries" / "bb" / "bb02.rcp"
    damaged.chmod(0o600)
    damaged.write_bytes(b"damaged")
    out = json.loads(cli_in("verify", "--fix", "--json", "-d", filled, code=None).stdout)
    assert out["bad"] == 2 and not long_name.exists() and not damaged.exists(), out
    assert len(list((filled / "quarantine").iterdir())) == 2
    assert json.loads(cli_in("verify", "--json", "-d", filled).stdout)["bad"] == 0


# -- entries that parse but cannot be served (item 13) -----------------------------------------------------------

BAD_PAYLOADS = {
    "guard divides by zero": program_bytes([["eq", ["floordiv", "s0", 0], 1]]),
    "guard on an unbound symbol": program_bytes([["eq", "s7", 2]]),
    "bucket on an unknown symbol": recipe_bytes(bucket={"s9": [1, 4]}),
}


@pytest.mark.parametrize("what", list(BAD_PAYLOADS))
def test_an_entry_serving_cannot_use_is_a_miss_quarantined_and_verify_lists_it(filled, what):
    from hpu_backend.serve.store import RecipeStore

    cache = make_cache(filled)
    cache.put("ff09", BAD_PAYLOADS[what], {"model": "m"}, wait=True)
    result = cli_in("verify", "--json", "-d", filled, code=None)
    out = json.loads(result.stdout)
    assert result.exit_code == 1 and out["bad"] == 1 and out["problems"][0]["entry"] == "ff09", out
    store = RecipeStore(cache)
    load = store.load_program if "guard" in what else store.load
    found = load("ff09") if "guard" in what else load("ff09", lambda r: r)
    cache.flush()
    assert found is None and not cache.contains("ff09") and cache.stats()["corrupt"] == 1
    assert any((filled / "quarantine").iterdir())


# -- the fleet tier: signatures, bad entries, hostile servers (items 3, 4, 8, 15, 16, 17) --------------------------


def _remote_cache(path: Path, url: str) -> RecipeCache:
    return RecipeCache(CacheConfig(path=path, fsync=False, memory_entries=0, remote=url))


@pytest.mark.e2e
@needs_redis
def test_with_a_key_unsigned_and_forged_fleet_entries_are_refused_once_and_deleted(tmp_path, redis_server,
                                                                                   monkeypatch, caplog):
    url, _, client = redis_server
    _remote_cache(tmp_path / "writer", url).put("aa01", recipe_bytes("a"), wait=True)  # no key: unsigned
    monkeypatch.setenv(KEY_ENV, "team-secret")
    other = _remote_cache(tmp_path / "reader", url)
    with caplog.at_level(logging.WARNING, "recipecache"):
        assert other.get("aa01") is None
    assert caplog.text.count("refusing remote entry") == 1 and client.exists("hpu_recipes:aa01") == 0
    signed = _remote_cache(tmp_path / "signer", url)
    signed.put("bb02", recipe_bytes("b"), wait=True)
    raw = client.get("hpu_recipes:bb02")
    assert raw.startswith(b"HPRS") and _remote_cache(tmp_path / "r2", url).get("bb02") == recipe_bytes("b")
    forged = raw[:4] + raw[4:36] + encode_entry("bb02", recipe_bytes("evil"))  # the tag of another content
    client.set("hpu_recipes:bb02", forged)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "recipecache"):
        assert _remote_cache(tmp_path / "r3", url).get("bb02") is None
    assert "another key" in caplog.text and client.exists("hpu_recipes:bb02") == 0
    monkeypatch.setenv(KEY_ENV, "other-key")
    signed.put("cc03", recipe_bytes("c"), wait=True)  # the first writer's key (read at open) still signs
    assert _remote_cache(tmp_path / "r4", url).get("cc03") is None
    monkeypatch.delenv(KEY_ENV)
    signed.put("dd04", recipe_bytes("d"), wait=True)
    assert _remote_cache(tmp_path / "r5", url).get("dd04") == recipe_bytes("d")  # no key: seal stripped, trusted


@pytest.mark.e2e
@needs_redis
def test_a_checksum_valid_malformed_fleet_entry_is_deleted_by_pull_and_by_serving(tmp_path, redis_server):
    from hpu_backend.serve.store import RecipeStore

    url, _, client = redis_server
    bad = recipe_bytes(bucket={"s9": [1, 4]})
    _remote_cache(tmp_path / "ci", url).put("ee05", bad, wait=True)
    assert client.exists("hpu_recipes:ee05") == 1
    host = _remote_cache(tmp_path / "host", url)
    from hpu_backend.shipping.cachepolicy import recipe_problem

    assert host.pull(["ee05"], check=recipe_problem) == 0 and not host.contains("ee05")
    assert client.exists("hpu_recipes:ee05") == 0  # deleted, so a good entry can take its place
    _remote_cache(tmp_path / "ci", url)._remote.put("ee05", encode_entry("ee05", bad))
    serving = _remote_cache(tmp_path / "serving", url)
    assert RecipeStore(serving).load("ee05", lambda r: r) is None
    serving.flush()
    assert client.exists("hpu_recipes:ee05") == 0 and not serving.contains("ee05")


class FakeRedis:
    """A tiny RESP server on loopback that answers +OK to everything except the commands in ``replies``,
    which get the crafted bytes (a callable gets the socket, to drip)."""

    def __init__(self, replies: dict):
        self.replies = {k.upper(): v for k, v in replies.items()}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn):
        buf = b""
        with conn:
            while not self.stop.is_set():
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while (command := self._command(buf)) is not None:
                    name, buf = command
                    reply = self.replies.get(name, b"+OK\r\n")
                    try:
                        reply(conn, self.stop) if callable(reply) else conn.sendall(reply)
                    except OSError:
                        return

    @staticmethod
    def _command(buf: bytes):
        """(command name, rest) of the first complete RESP array of bulk strings in buf, or None."""
        if not buf.startswith(b"*") or b"\r\n" not in buf:
            return None
        head, rest = buf.split(b"\r\n", 1)
        words = []
        for _ in range(int(head[1:])):
            if b"\r\n" not in rest:
                return None
            length, rest = rest.split(b"\r\n", 1)
            n = int(length[1:])
            if len(rest) < n + 2:
                return None
            words.append(rest[:n])
            rest = rest[n + 2:]
        return words[0].decode().upper(), rest

    def close(self):
        self.stop.set()
        self.sock.close()


def _drip(conn, stop):
    conn.sendall(b"$100\r\n")
    while not stop.wait(0.1):
        conn.sendall(b"x")  # a byte every 100 ms: no single read ever times out


def _huge(conn, stop):
    conn.sendall(b"$4000000000\r\n" + b"x" * 65536)
    stop.wait(5)


HELLO3 = b"%1\r\n+proto\r\n:3\r\n"  # the map redis-py expects in answer to HELLO 3

# Each case: the crafted replies, the URL's query, and what its one warning says.
HOSTILE = {
    "a slow-drip reply": ({"GET": _drip}, "?protocol=2", "within"),
    "an odd reply to HELLO": ({"HELLO": b"+OK\r\n"}, "", "AttributeError"),  # redis-py expects a map
    "an error with escape codes": ({"GET": b"-ERR \x1b[31mred\x1b]0;title\x07\r\n"}, "?protocol=2", "\\x1b[31mred"),
    "an integer reply of 4e9 to GET": ({"GET": b":4000000000\r\n"}, "?protocol=2", "not a string"),
    "an integer reply of 1e15 to GET": ({"GET": b":1000000000000000\r\n"}, "?protocol=2", "not a string"),
    "a float reply to GET": ({"HELLO": HELLO3, "GET": b",1.5\r\n"}, "?protocol=3", "not a string"),
    "a map reply to GET": ({"HELLO": HELLO3, "GET": b"%1\r\n+a\r\n+b\r\n"}, "?protocol=3", "not a string"),
    "a 10^15-element array": ({"GET": b"*1000000000000000\r\n:1\r\n"}, "?protocol=2", "elements"),
    "a negative length": ({"GET": b"$-7\r\n"}, "?protocol=2", "-7 bytes"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_server_costs_one_warning_and_a_bounded_wait(tmp_path, case, caplog, no_gc_pause):
    replies, query, says = HOSTILE[case]
    server = FakeRedis(replies)
    try:
        # With a password, HELLO carries AUTH and its reply goes unchecked: the odd reply needs none.
        auth = "" if "HELLO" in replies else ":s3cret-pw@"
        url = f"redis://{auth}127.0.0.1:{server.port}/0{query}"
        cache = _remote_cache(tmp_path / "c", url)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, "recipecache"):
            for key in ("aa01", "bb02", "cc03"):
                assert cache.get(key) is None  # a miss, then the local tiers
        assert time.perf_counter() - start < 3.0
        assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024 < 256 * 1024**2
        cache.put("dd04", b"local", wait=True)
        assert cache.get("dd04") == b"local"
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "unavailable" in warnings[0] and says in warnings[0], warnings
        assert "s3cret" not in caplog.text and "\x1b" not in caplog.text
    finally:
        server.close()


def test_a_forged_4_gb_value_is_one_refused_entry_not_a_server_fault(tmp_path, caplog, no_gc_pause):
    """The value is refused from its length line, before anything is read; the tier stays on, and the
    entry is deleted (the server receives the conditional delete)."""
    seen = []

    def record_eval(conn, stop):
        seen.append("EVAL")
        conn.sendall(b":1\r\n")

    server = FakeRedis({"GET": _huge, "EVAL": record_eval})
    try:
        cache = _remote_cache(tmp_path / "c", f"redis://127.0.0.1:{server.port}/0?protocol=2")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with caplog.at_level(logging.WARNING, "recipecache"):
            assert cache.get("aa01") is None and cache.get("bb02") is None
        assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024 < 256 * 1024**2
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "4000000000 bytes, over the" in warnings[0], warnings
        assert cache.remote.available and seen == ["EVAL", "EVAL"]
    finally:
        server.close()


def test_nested_arrays_are_bounded_in_all_not_only_each(tmp_path, monkeypatch, caplog, no_gc_pause):
    """Two arrays within the element limit (made small here), nested in one reply, exceed it in all."""
    import recipecache.remote as remote

    monkeypatch.setattr(remote, "MAX_ITEMS", 1000)
    server = FakeRedis({"GET": b"*2\r\n" + (b"*1000\r\n" + b":1\r\n" * 1000) * 2})
    try:
        cache = _remote_cache(tmp_path / "c", f"redis://127.0.0.1:{server.port}/0?protocol=2")
        with caplog.at_level(logging.WARNING, "recipecache"):
            assert cache.get("aa01") is None
        assert "a reply of more than 1000 elements" in caplog.text and not cache.remote.available
    finally:
        server.close()


@pytest.mark.e2e
@needs_redis
def test_one_oversized_fleet_value_is_skipped_and_deleted_and_pull_fetches_the_rest(tmp_path, redis_server,
                                                                                   monkeypatch, caplog):
    """A value over the reply limit (made small here), or a list in a value's place, costs one warning and is
    deleted, with or without a signing key; the other entries arrive and the tier is not reported unreachable."""
    import recipecache.remote as remote

    url, _, client = redis_server
    monkeypatch.setenv(KEY_ENV, "team-secret")
    _remote_cache(tmp_path / "ci", url).put("aa01", recipe_bytes("a"), wait=True)
    monkeypatch.setattr(remote, "MAX_REPLY", 64 * 1024)
    client.set("hpu_recipes:bb02", b"x" * (100 * 1024))
    client.rpush("hpu_recipes:cc03", b"a list where a value belongs")
    host = _remote_cache(tmp_path / "host", url)
    with caplog.at_level(logging.WARNING, "recipecache"):
        assert host.pull(["bb02", "cc03", "aa01"]) == 1
    assert host.contains("aa01") and not host.contains("bb02") and host.remote.available
    assert client.exists("hpu_recipes:bb02", "hpu_recipes:cc03") == 0 and client.exists("hpu_recipes:aa01") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "over the 65536-byte limit" in warnings[0], warnings


def test_cli_errors_redact_the_password_and_a_nan_ttl_is_one_line(filled, monkeypatch):
    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    result = cli_in("push", "-d", filled, "--remote", url, code=1, says="server unreachable")
    assert "s3cret" not in result.output and ":***@127.0.0.1" in result.output
    monkeypatch.setenv("HPU_RECIPE_CACHE_REMOTE_TTL", "nan")
    result = cli_in("push", "-d", filled, "--remote", url, code=2, says="finite")
    assert "unexpected" not in result.output
    monkeypatch.delenv("HPU_RECIPE_CACHE_REMOTE_TTL")
    result = cli_in("push", "-d", filled, "--remote", "http://:s3cret-pw@127.0.0.1/0", code=2, says="expected redis")
    assert "s3cret" not in result.output and "s3cret" not in repr(CacheConfig(path=filled, remote=url))


def test_a_server_that_dies_during_warm_costs_one_warning(tmp_path, caplog):
    from cli_helpers import tiny_model

    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens: every call fails, as after a crash
    with caplog.at_level(logging.WARNING):  # warm opens a session of its own: a store of its own over the cache
        result = CliRunner().invoke(app, ["warm", str(tiny_model(tmp_path)), "-d", str(tmp_path / "c")],
                                    env={"HPU_RECIPE_CACHE_REMOTE": url})
    assert result.exit_code == 0, result.output
    remote = [r.getMessage() for r in caplog.records if "remote" in r.getMessage() or "manifest" in r.getMessage()]
    assert len(remote) == 1 and "unavailable" in remote[0], remote  # not a second one for the manifest
    output = " ".join(result.output.split())
    assert "could not send the manifest to redis://:***@127.0.0.1" in output, output
    assert "s3cret" not in output and "s3cret" not in caplog.text


# -- no import cycle (issue 22) ----------------------------------------------------------------------------------

def test_the_cache_core_does_not_import_the_disabled_cache():
    import ast

    tree = ast.parse((ROOT / "recipecache" / "cache.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "disabled" not in imported and "recipecache.disabled" not in imported


# -- a stored program whose template guard cannot be evaluated (issue 34, cause 9) --------------------------------

def test_a_program_template_guard_with_a_huge_power_is_quarantined_not_failing_every_run(tmp_path, caplog):
    import torch

    from hpu_backend.formats.program import Program
    from hpu_backend.serve.session import Session
    from hpu_backend.settings import Settings
    from recipecache import decode_entry

    config = CacheConfig(path=tmp_path / "c", fsync=False)
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)

    def run():
        """A new Dynamo and a session of its own over the cache (as in a fresh process), flushed on return."""
        torch._dynamo.reset()
        session = Session.open(Settings.from_options({"cache_config": config}))
        compiled = torch.compile(model, backend="hpu_backend", dynamic=True, options={"cache_config": config})
        with session.use():
            out = compiled(x)
        session.flush()
        return out

    run()
    cache = RecipeCache(config)
    [key] = [i.key for i in cache.entries() if i.meta.get("kind") == "program"]
    path = cache._disk.entry_path(key)
    entry = decode_entry(path.read_bytes())
    program = Program.from_bytes(entry.payload)
    program.graphs[0].template.guards.append(["eq", ["pow", program.symbols[0], 10**6], 1])
    path.chmod(0o600)
    path.write_bytes(encode_entry(key, program.to_bytes(), entry.meta, entry.created))
    verified = cli_in("verify", "--json", "-d", config.path, code=None)
    listed = json.loads(verified.stdout)["problems"]
    assert verified.exit_code == 1 and [p["entry"] for p in listed] == [key], listed
    assert "cannot be evaluated" in listed[0]["reason"]
    with caplog.at_level(logging.WARNING):
        torch.testing.assert_close(run(), model(x))  # served eagerly this time
    assert "cannot be evaluated" in caplog.text and not RecipeCache(config).contains(key)
    assert any(p.name.startswith(key) for p in (tmp_path / "c" / "quarantine").iterdir())
    torch.testing.assert_close(run(), model(x))  # and compiled afresh the next time
    assert RecipeCache(config).contains(key)
