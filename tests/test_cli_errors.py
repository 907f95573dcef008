"""Bad input to hpurecipe is one line naming what is wrong and what to do, never a traceback."""

from __future__ import annotations

import gzip
import io
import tarfile
import time

import pytest
import torch
import typer

from hpurecipe.errors import mapped
from recipecache import CacheConfig, RecipeCache, decode_entry, encode_entry

from cli_helpers import INPUTS, LINEAR, TINY, cli, cli_json, one_line, tiny_model

HEAD = 'import torch\nAXES = {"batch": [2]}\nCOMPILE = {"dynamic": False, "options": {}}\n'


@pytest.mark.parametrize("text, args, expected", [
    (HEAD + LINEAR + INPUTS, ["--train"], "training needs a loss(output, *inputs) function"),
    (HEAD + LINEAR + "def make_inputs(batch, seed=0):\n    return torch.randn(batch, 4)\n", [],
     "make_inputs must return a tuple of inputs, got Tensor"),
    (HEAD + "def make_model():\n    raise RuntimeError('no weights here')\n" + INPUTS, [],
     "make_model() raised RuntimeError: no weights here"),
    (HEAD + LINEAR + "def make_inputs(batch, seed=0):\n    return (torch.randn(batch, 4), 1)\n", [],
     "the model at batch=2 raised TypeError"),
    (HEAD + LINEAR + "def make_inputs(batch, seed=0):\n    return (1 / 0,)\n", [],
     "make_inputs(batch=2) raised ZeroDivisionError"),
], ids=["no-loss", "bare-tensor", "make_model-raises", "forward-raises", "make_inputs-raises"])
def test_a_broken_model_file_is_one_line_naming_the_file(tmp_path, text, args, expected):
    path = tiny_model(tmp_path, "broken", text)
    line = one_line(cli("warm", path, "-d", tmp_path / "c", *args, code=1))
    assert line.startswith("error:") and str(path) in line and expected in line


def test_export_to_a_missing_directory_and_import_of_garbage(tmp_path):
    cli("warm", tiny_model(tmp_path), "-d", tmp_path / "c")
    line = one_line(cli("export", tmp_path / "no" / "such" / "x.tar", "-d", tmp_path / "c", code=1))
    assert "there is no directory" in line
    (tmp_path / "garbage.tar").write_bytes(bytes(range(256)) * 20)
    assert "not a bundle" in one_line(cli("import", tmp_path / "garbage.tar", "-d", tmp_path / "d", code=1))
    assert "cannot read" in one_line(cli("import", tmp_path / "absent.tar", "-d", tmp_path / "d", code=1))


def test_a_bundle_member_is_refused_by_its_header_before_anything_is_read(tmp_path):
    """A small .tar.gz whose member claims 1 GiB: refused from the header, without inflating it."""
    member = tarfile.TarInfo("entries/ab.rcp")
    member.size = 1 << 30
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
        gz.write(member.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 4096)
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(raw.getvalue())
    start = time.perf_counter()
    line = one_line(cli("import", path, "-d", tmp_path / "d", code=1))
    assert "1,073,741,824 bytes, over the" in line and time.perf_counter() - start < 5


def test_a_manifest_that_cannot_be_written_is_a_warning(tmp_path):
    cache = tmp_path / "c"
    cache.mkdir(mode=0o700)
    (cache / "manifests").write_text("not a directory")
    result = cli("warm", tiny_model(tmp_path), "-d", cache)  # exit 0: the recipes are cached
    assert "warning: cannot write the manifest" in result.output and "Traceback" not in result.output
    assert len(cli_json("ls", "-d", cache)) >= 2


def test_stored_strings_reach_the_terminal_escaped(tmp_path):
    cache_dir = tmp_path / "c"
    cli("warm", tiny_model(tmp_path), "-d", cache_dir)
    cache = RecipeCache(CacheConfig.parse(f"{cache_dir},false,64"))
    key = cli_json("ls", "-d", cache_dir)[0]["key"]
    path = cache._disk.entry_path(key)
    entry = decode_entry(path.read_bytes())
    evil = "\x1b]0;owned\x07\x1b[2J"
    path.chmod(0o600)
    path.write_bytes(encode_entry(key, entry.payload, dict(entry.meta, model=evil, graph=evil), entry.created))
    for args in (["ls"], ["show", key], ["stats"]):
        out = cli(*args, "-d", cache_dir).output
        assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned" in cli("ls", "-d", cache_dir).output


def test_an_unexpected_failure_is_one_line_with_the_way_to_the_traceback(capsys, monkeypatch):
    monkeypatch.delenv("HPURECIPE_TRACEBACK", raising=False)
    with pytest.raises(typer.Exit) as exc:
        mapped(lambda: {}["missing"])()
    assert exc.value.exit_code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unexpected KeyError") and "HPURECIPE_TRACEBACK=1" in err and "\n" not in err
    monkeypatch.setenv("HPURECIPE_TRACEBACK", "1")
    with pytest.raises(KeyError):
        mapped(lambda: {}["missing"])()


def test_the_traceback_switch_shows_where_a_model_file_failed(tmp_path, monkeypatch):
    path = tiny_model(tmp_path, "broken", TINY.replace("def make_model():", "def make_model():\n    deep_failure()")
                      + "\ndef deep_failure():\n    raise RuntimeError('boom')\n")
    monkeypatch.delenv("HPURECIPE_TRACEBACK", raising=False)
    quiet = cli("warm", path, "-d", tmp_path / "c", code=1).output
    assert "make_model() raised RuntimeError: boom" in quiet and "Traceback" not in quiet
    monkeypatch.setenv("HPURECIPE_TRACEBACK", "1")
    loud = cli("warm", path, "-d", tmp_path / "c", code=1).output
    assert "Traceback" in loud and "in deep_failure" in loud and "make_model() raised RuntimeError: boom" in loud



def test_the_cli_uses_the_limit_the_cache_was_filled_with(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{cache},false,3")
    cli("warm", tiny_model(tmp_path), "-d", cache)
    monkeypatch.delenv("PT_HPU_RECIPE_CACHE_CONFIG")
    assert cli_json("stats", "-d", cache)["limit_bytes"] == 3 * 2**20


def test_warm_into_a_disabled_cache_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{tmp_path / 'c'},false,0")
    line = one_line(cli("warm", tiny_model(tmp_path), code=2))
    assert "the recipe cache is disabled" in line and not (tmp_path / "c").exists()


def test_push_and_pull_without_a_remote_tier_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HPU_RECIPE_CACHE_REMOTE", "none")
    model = tiny_model(tmp_path)
    cli("warm", model, "-d", tmp_path / "c")
    for args in (["push", "-d", tmp_path / "c"], ["pull", model, "-d", tmp_path / "d"]):
        assert "no remote cache configured" in one_line(cli(*args, code=1))
    assert "remote" not in cli_json("stats", "-d", tmp_path / "c")  # stats counts a fleet tier only if there is one


# -- warm says why the cache lacks what it built (issue 34, cause 8) ----------------------------------------------

def test_warm_into_a_cache_that_cannot_be_written_fails_naming_it_not_the_size(tmp_path, monkeypatch):
    """Root ignores mode bits: the error a read-only file system gives is injected where entries are written."""
    import errno

    import recipecache.disk

    def read_only(fd, data):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(recipecache.disk, "_write_file", read_only)
    model = tiny_model(tmp_path)
    for args in ([], ["--check"]):
        cache = tmp_path / f"c{len(args)}"
        out = " ".join(cli("warm", model, "-d", cache, *args, code=1).output.split())
        assert "the cache holds none of the entries these buckets use" in out, out
        assert "3 of the 3 entries these buckets use could not be stored" in out and "Read-only file system" in out
        assert "too small" not in out and "MiB" not in out


@pytest.mark.e2e
def test_warm_names_entries_another_process_removed_during_the_run(tmp_path, capsys):
    """Another process clears the cache after the last bucket: the report says so and does not blame the size."""
    import subprocess
    import sys

    from hpu_backend.modelfiles.modelfile import load_model_file
    from hpu_backend.shipping.warm import warm
    from hpu_backend.serve.session import session_for
    from hpu_backend.settings import Settings
    from hpurecipe.warmreport import finish

    spec, config = load_model_file(str(tiny_model(tmp_path))), CacheConfig.parse(f"{tmp_path / 'c'},false,64")
    clear = f"from recipecache import *; RecipeCache(CacheConfig.parse({str(config.path)!r} + ',false,64')).clear()"

    def clear_after_the_last(point):
        if point.point == spec.points()[-1]:
            session_for(Settings.from_options({"cache_config": config})).store.flush()  # the warm-up's own store
            subprocess.run([sys.executable, "-c", clear], check=True, timeout=60)

    report = warm(spec, config, on_point=clear_after_the_last)
    assert report.fit.evicted and not report.fit.trimmed and not report.fit.unstored, report.fit
    assert all(how.startswith("clear by another process") for how in report.fit.removed.values())
    with pytest.raises(typer.Exit) as exc:
        finish(report, config, json=False, check=False)  # nothing is left: a CI step must not pass
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.exit_code == 1 and "3 of the 3 entries these buckets use were removed during the run" in err
    assert "clear by another process" in err and "too small" not in err and "MiB" not in err


def test_a_cache_trimmed_for_other_entries_is_never_told_to_shrink():
    """Entries trimmed while the cache also holds other models' entries: the advice counts those, and is never
    a size at or below the current limit."""
    from hpu_backend.shipping.reports import CacheFit

    mib = 2**20
    fit = CacheFit(4 * mib, needed=2, needed_bytes=mib, evicted=["a"], trimmed=["a"], other_bytes=mib)
    assert fit.suggested_mb > 4 and CacheFit(None, 2, mib).suggested_mb == 1.3


# -- numeric options are bounded when parsed (issue 34, cause 9) -------------------------------------------------

HUGE = "9" * 400


@pytest.mark.parametrize("args, says", [
    (["analyze", "M", "--train", "--seq", "16", "--global-batch", "8", "--bucket-mb", "inf"],
     "--bucket-mb inf: expected a number from 0.001 to 1,048,576"),
    (["analyze", "M", "--bucket-mb", "nan"], "--bucket-mb nan: expected a number"),
    (["analyze", "M", "--timeout", "1e308"], "--timeout 1e+308: expected a number from 0 to 604,800"),
    (["warm", "M", "--timeout", "nan"], "--timeout nan"),
    (["analyze", "M", "--input-len", "8", "--output-len", "8", "--batch", "99999999999999999999"],
     "--batch 99999999999999999999: expected a positive integer, at most 1,048,576"),
    (["analyze", "M", "--train", "--seq", HUGE, "--global-batch", "8"], "--seq 9999"),
    (["analyze", "M", "--zero", "-1"], "--zero -1: expected an integer from 0 to 3"),
    (["prebuild", "M", "--jobs", "100000"], "--jobs 100000: expected a positive integer"),
    (["evict", "--older-than", HUGE + "d", "--yes"], "--older-than"),
    (["evict", "--max-size", HUGE + "GB", "--yes"], "--max-size"),
], ids=["inf", "nan", "timeout-1e308", "timeout-nan", "batch-20-digits", "seq-400-digits", "zero", "jobs",
        "older-than", "max-size"])
def test_numeric_options_out_of_range_are_one_usage_line_naming_the_range(tmp_path, args, says):
    model = tiny_model(tmp_path)
    args = [model if a == "M" else a for a in args]
    start = time.perf_counter()
    line = " ".join(cli(*args, "-d" if args[0] == "evict" else "--json", *(
        [tmp_path / "c"] if args[0] == "evict" else []), code=2).output.split())
    assert line.startswith("error:") and line.count("error:") == 1 and says in line, line
    assert "unexpected" not in line and time.perf_counter() - start < 30


SHAPE_BUG = '''
import torch

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))

def make_inputs(batch):
    return (torch.randn(batch, 2),)

AXES = {"batch": [1, 4]}
'''


@pytest.mark.parametrize("command", ["warm", "analyze", "package"])
def test_a_shape_error_in_the_model_is_one_line_with_the_real_cause_and_no_tracer_log(tmp_path, capfd, command):
    """The trace fails on fake tensors; the model run eagerly on the same inputs names the real cause with real
    sizes, and torch's fake-tensor log (a traceback per failed op) stays quiet."""
    path = tiny_model(tmp_path, "shape_bug", SHAPE_BUG)
    args = {"warm": ["-d", tmp_path / "c"], "analyze": [], "package": ["-o", tmp_path / "x.hpkg"]}[command]
    line = one_line(cli(command, path, *args, code=1))
    assert "(1x2 and 3x2)" in line or "(4x2 and 3x2)" in line, line
    assert "run eagerly too" in line and "fix the model or make_inputs" in line
    assert "fake tensor" not in line and "AXES" not in line  # neither the tracer's wrapper nor a wrong fix
    assert "fake_tensor" not in capfd.readouterr().err and not (tmp_path / "x.hpkg").exists()


def test_a_tracer_only_failure_names_the_ops_own_error_not_dynamos_wrapper():
    from hpu_backend.errors import one_line as text_of

    wrapped = RuntimeError("RuntimeError when making fake tensor call\n  Explanation: Dynamo failed to run FX node "
                           "with fake tensors: call_function mm(...): got RuntimeError('a and b must have same "
                           "reduction dim, but got [1, s5] X [3, 2].')\n  Hint: ...")
    assert text_of(wrapped) == "RuntimeError: a and b must have same reduction dim, but got [1, s5] X [3, 2]."


def test_compile_and_seed_are_optional_and_what_is_missing_is_still_one_line(tmp_path):
    from hpu_backend.modelfiles.modelspec import ModelFileError, spec_from

    seen = []

    def make_inputs(batch):
        seen.append(batch)
        return (torch.randn(batch, 4),)

    spec = spec_from({"make_model": lambda: torch.nn.Linear(4, 4), "make_inputs": make_inputs,
                      "AXES": {"batch": [2]}}, "dict")
    assert (spec.dynamic, spec.options, spec.seeded) == (None, {}, False)
    assert spec.inputs({"batch": 2}, seed=5)[0].shape == (2, 4) and seen == [2]
    doc = cli_json("warm", tiny_model(tmp_path, "short", "import torch\n" + LINEAR +
                                      "def make_inputs(batch):\n    return (torch.randn(batch, 4),)\n"
                                      'AXES = {"batch": [2, 4]}\n'), "-d", tmp_path / "c", "--check")
    assert doc["buckets"] == 2 and doc["mismatches"] == 0  # compared with eager at each point
    with pytest.raises(ModelFileError, match=r"make_inputs must accept the axes \(batch\) as keyword arguments"):
        spec_from({"make_model": lambda: torch.nn.Linear(4, 4), "make_inputs": lambda size: (),
                   "AXES": {"batch": [2]}}, "dict")
