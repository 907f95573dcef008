"""hpurecipe commands through typer's CliRunner on real temporary caches, with a tiny model file."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest

from hpu_backend.shipping.manifests import read_manifests
from recipecache import CacheConfig, RecipeCache

from cli_helpers import TINY, cli, cli_json, cli_process, tiny_model


@pytest.fixture(scope="session")
def tiny_file(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def warmed_master(tmp_path_factory, tiny_file):
    cache = tmp_path_factory.mktemp("warmed") / "cache"
    cli("warm", tiny_file, "--cache-dir", cache)
    return cache


@pytest.fixture
def warmed(tmp_path, warmed_master):
    """A private copy of a cache warmed with the tiny model (2 buckets, 2 recipes, 1 program)."""
    return shutil.copytree(warmed_master, tmp_path / "cache")


def keys_of(cache_dir) -> list[str]:
    return sorted(row["key"] for row in cli_json("ls", "-d", cache_dir))


def recipe_keys(cache_dir) -> list[str]:
    """The recipes' keys (a warm also stores one program per Dynamo graph)."""
    return sorted(row["key"] for row in cli_json("ls", "-d", cache_dir) if row["kind"] != "program")


# -- warm / prebuild / coverage / analyze ------------------------------------------------------------------

def test_warm_fills_the_cache_then_hits_and_writes_a_manifest(tmp_path, tiny_file):
    cache = tmp_path / "c"
    first = cli_json("warm", tiny_file, "-d", cache)
    assert (first["buckets"], first["compiled"], first["hits"]) == (2, 2, 0) and first["seconds"] > 0
    again = cli_json("warm", tiny_file, "-d", cache)
    assert (again["buckets"], again["compiled"], again["hits"]) == (2, 0, 2)
    (manifest,) = read_manifests(cache)
    assert manifest["model"] == "tiny" and set(manifest["buckets"]) == {"batch=2", "batch=8"}
    assert sorted({k for ks in manifest["buckets"].values() for k in ks}) == keys_of(cache)


def test_warm_human_output_has_a_table_and_summary(tmp_path, tiny_file):
    out = cli("warm", tiny_file, "-d", tmp_path / "c", "--check").output
    assert "batch=8" in out and "compiled" in out and "ok" in out
    assert "2 shape points using 2 distinct recipes: 2 compiled, 0 reused" in out


def test_warm_check_compares_with_eager(tmp_path, tiny_file):
    doc = cli_json("warm", tiny_file, "-d", tmp_path / "c", "--check")
    assert doc["mismatches"] == 0 and all(p["max_abs_diff"] is not None for p in doc["points"])


PYTREE_OUTPUT = """
import torch
from transformers.modeling_outputs import SequenceClassifierOutput

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)

    def forward(self, x):
        return OUTPUT

def make_model():
    torch.manual_seed(0)
    return Net()

def make_inputs(batch, seed=0):
    return (torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed)),)

def loss(output, x):
    return LOSS

AXES = {"batch": [2, 4]}
COMPILE = {"dynamic": True, "options": {}}
"""


@pytest.mark.e2e
@pytest.mark.parametrize("output, loss", [
    ("(self.a(x), {'aux': self.b(x)})", "output[0].sum() + output[1]['aux'].pow(2).sum()"),
    ("{'logits': self.a(x), 'pair': (self.b(x), x)}", "output['logits'].sum() + output['pair'][0].sum()"),
    ("SequenceClassifierOutput(logits=self.a(x), hidden_states=(self.b(x),))",
     "output.logits.pow(2).sum() + output.hidden_states[0].sum()"),
], ids=["tuple", "dict", "ModelOutput"])
def test_warm_and_analyze_train_take_any_pytree_of_outputs(tmp_path, output, loss):
    path = tiny_model(tmp_path, "pytree", PYTREE_OUTPUT.replace("OUTPUT", output).replace("LOSS", loss))
    doc = cli_json("warm", path, "-d", tmp_path / "c", "--train", "--check")
    assert doc["mismatches"] == 0 and doc["compiled"] >= 2
    assert all(p["max_abs_diff"] is not None for p in doc["points"])
    rows = cli_json("analyze", path, "--train")["buckets"]
    assert len(rows) == 2 and all(r["recipes"] >= 2 for r in rows)  # forward and backward at each point


@pytest.mark.e2e
def test_warm_says_when_the_cache_is_too_small_and_how_large_it_must_be(tmp_path, tiny_file, monkeypatch):
    small = tmp_path / "small"
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{small},false,0.004")
    fit = cli_json("warm", tiny_file, "-d", small)["cache_fit"]  # a warning only: exit 0
    assert not fit["fits"] and fit["evicted"] and fit["needed"] == 3 and fit["needed_bytes"] > 0.004 * 2**20
    out = cli("warm", tiny_file, "-d", small, "--check", code=1).output
    assert "the cache is too small" in out and f"at least {fit['suggested_mb']:g} MiB" in out
    gate = cli("coverage", tiny_file, "-d", small, code=1).output  # not "run: hpurecipe warm" again
    assert "not fully cached because the cache is too small" in gate and "run: hpurecipe warm" not in gate
    large = tmp_path / "large"  # the size it asked for is enough
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{large},false,{fit['suggested_mb']}")
    assert cli_json("warm", tiny_file, "-d", large, "--check")["cache_fit"] == dict(
        fit, fits=True, evicted=[], trimmed=[], limit_bytes=int(fit["suggested_mb"] * 2**20))


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["analyze", "coverage"])
def test_long_commands_show_progress_on_a_terminal_only(tiny_file, monkeypatch, command):
    from rich.console import Console

    from hpurecipe import render

    def stderr_of(*args, terminal: bool) -> str:
        err = io.StringIO()
        monkeypatch.setattr(render, "err_console", Console(file=err, force_terminal=terminal, width=100))
        cli(command, tiny_file, *args, code=None)
        return err.getvalue()

    shown = stderr_of(terminal=True)
    assert "buckets" in shown and "2/2" in shown and "batch=8" in shown
    assert stderr_of(terminal=False) == ""  # piped
    assert stderr_of("--json", terminal=True) == ""


@pytest.mark.e2e
def test_analyze_shows_the_point_and_the_bucket_end_it_was_planned_at(tmp_path):
    path = tiny_model(tmp_path, "wide", TINY.replace('"exp:2"', '"exp:16"'))  # batch 2 and 8 share bucket 0-16
    rows = cli_json("analyze", path)["buckets"]
    assert [(r["point"], r["planned_at"]) for r in rows] == [({"batch": 2}, {"batch": 16}), ({"batch": 8},
                                                                                             {"batch": 16})]
    assert rows[0]["peak_hbm_bytes"] == rows[1]["peak_hbm_bytes"]  # one plan, at batch 16
    out = cli("analyze", path).output
    assert "planned at" in out and "upper end of each point's bucket" in out
    assert any(line.split()[:2] == ["batch=2", "batch=16"] for line in out.splitlines())


@pytest.mark.e2e
def test_warm_shows_cpu_fallbacks(tmp_path):
    text = TINY.replace("torch.nn.ReLU()", "Digamma()").replace("def make_model():", """class Digamma(torch.nn.Module):
    def forward(self, x):
        return torch.special.digamma(x.abs().bfloat16() + 0.5).float()

def make_model():""")
    path = tiny_model(tmp_path, "fallback", text)
    doc = cli_json("warm", path, "-d", tmp_path / "c", "--check")
    assert doc["fallback_ops"] == ["aten::digamma"]
    assert all(p["fallback_ops"] == ["aten::digamma"] for p in doc["points"])
    out = cli("warm", path, "-d", tmp_path / "c").output
    assert "fallbacks" in out.splitlines()[0] and "CPU fallback ops: aten::digamma" in out
    assert "CPU fallback" not in cli("warm", tiny_model(tmp_path), "-d", tmp_path / "c").output


def test_warm_train_caches_forward_and_backward(tmp_path, tiny_file):
    cache = tmp_path / "c"
    doc = cli_json("warm", tiny_file, "-d", cache, "--train", "--check")
    assert doc["mode"] == "train" and doc["mismatches"] == 0
    kinds = {row["kind"] for row in cli_json("ls", "-d", cache)}
    assert kinds == {"forward", "backward", "program"}


def test_axis_override_and_bad_axes(tmp_path, tiny_file):
    doc = cli_json("warm", tiny_file, "-d", tmp_path / "c", "--axis", "batch=3,4,16")
    assert [p["point"] for p in doc["points"]] == [{"batch": 3}, {"batch": 4}, {"batch": 16}]
    assert "no axis seq" in cli("warm", tiny_file, "--axis", "seq=1", code=1).output
    assert "NAME=V1,V2" in cli("warm", tiny_file, "--axis", "batch", code=2).output


def test_prebuild_in_process_matches_warm(tmp_path, tiny_file, warmed):
    doc = cli_json("prebuild", tiny_file, "-d", tmp_path / "p")
    assert doc["compiled"] == 2
    assert keys_of(tmp_path / "p") == keys_of(warmed)


@pytest.mark.e2e
def test_prebuild_in_two_worker_processes_makes_the_keys_warm_makes(tmp_path, tiny_file):
    axes = ["--axis", "batch=1,2,8"]  # batch 1 gets a graph of its own (Dynamo specializes it)
    warm = cli_json("warm", tiny_file, "-d", tmp_path / "w", *axes)
    doc = cli_process("prebuild", tiny_file, "-d", tmp_path / "p", "-j", "2", *axes)
    assert doc["buckets"] == 3 and doc["compiled"] == warm["compiled"] == 3
    assert [p["keys"] for p in doc["points"]] == [p["keys"] for p in warm["points"]]
    assert keys_of(tmp_path / "p") == keys_of(tmp_path / "w")
    assert read_manifests(tmp_path / "p")[0]["buckets"] == read_manifests(tmp_path / "w")[0]["buckets"]


def test_model_file_missing_names_is_one_line(tmp_path):
    bad = tiny_model(tmp_path, "bad", "import torch\ndef make_model():\n    return torch.nn.Linear(2, 2)\n")
    result = cli("warm", bad, "-d", tmp_path / "c", code=1)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "missing make_inputs" in lines[0] and "AXES" in lines[0]
    assert "COMPILE" not in lines[0]  # optional: {} when left out
    assert "no such model file" in cli("warm", tmp_path / "nope.py", code=1).output


def test_coverage_is_a_deployment_gate(tmp_path, tiny_file, warmed):
    doc = cli_json("coverage", tiny_file, "-d", warmed)
    assert (doc["buckets"], doc["covered"], doc["uncovered"]) == (2, 2, [])
    assert "2 of 2 buckets covered" in cli("coverage", tiny_file, "-d", warmed).output
    victim = doc["points"][1]
    cli("evict", "-d", warmed, "--key", cli_json("ls", "-d", warmed)[0]["key"], "--yes")
    missing = cli_json("coverage", tiny_file, "-d", warmed, code=1)
    assert missing["covered"] == 1 and len(missing["uncovered"]) == 1 and victim["recipes"] == 1
    assert "not fully cached" in cli("coverage", tiny_file, "-d", tmp_path / "empty", code=1).output


def test_analyze_reports_buckets_and_largest_batch(tiny_file):
    doc = cli_json("analyze", tiny_file, "--target", "gaudi3")
    assert doc["target"] == "gaudi3" and [r["bucket"] for r in doc["buckets"]] == ["batch=2", "batch=8"]
    row = doc["buckets"][1]
    assert row["fallbacks"] == 0 and row["graph_breaks"] == 0 and row["recipes"] == 1
    assert row["time_s"] > 0 and row["peak_hbm_bytes"] > 0
    assert doc["max_batch"]["batch"] > 8
    out = cli("analyze", tiny_file).output
    assert "peak HBM" in out and "Largest batch" in out
    assert "gaudi2 or gaudi3" in cli("analyze", tiny_file, "--target", "tpu", code=2).output


# -- inspecting ----------------------------------------------------------------------------------------

def test_ls_lists_entries_sorted_and_filtered(warmed):
    rows = cli_json("ls", "-d", warmed, "--sort", "size")
    assert len(rows) == 3 and {r["model"] for r in rows} == {"tiny"}
    assert [r["size"] for r in rows] == sorted((r["size"] for r in rows), reverse=True)
    assert cli_json("ls", "-d", warmed, "--model", "other") == []
    out = cli("ls", "-d", warmed).output
    assert rows[0]["key"][:12] in out and "s0=" in out and ("ago" in out or "just now" in out)


def test_missing_or_empty_cache_is_a_friendly_message(tmp_path):
    assert "No recipe cache at" in cli("ls", "-d", tmp_path / "none").output
    assert cli_json("ls", "-d", tmp_path / "none") == []
    assert cli_json("stats", "-d", tmp_path / "none")["entries"] == 0
    out = cli("show", "abc", "-d", tmp_path / "none", code=1).output
    assert out.startswith("error: no recipe cache") and len(out.strip().splitlines()) == 1
    RecipeCache(CacheConfig(tmp_path / "empty", max_size_mb=10))
    assert "No entries" in cli("ls", "-d", tmp_path / "empty").output
    assert "Nothing to evict" in cli("evict", "-d", tmp_path / "empty", "--older-than", "1d").output


def test_show_prints_a_recipe_by_unique_prefix(warmed):
    key = recipe_keys(warmed)[0]
    doc = cli_json("show", key[:6], "-d", warmed)
    assert doc["key"] == key and doc["model"] == "tiny" and doc["kind"] == "inference"
    assert doc["inputs"] and doc["outputs"][0]["shape"] and "placement" in doc and "guards" in doc
    assert "compile_time_s" in doc["facts"]
    out = cli("show", key[:6], "-d", warmed).output
    for section in ("inputs", "outputs", "placement", "guards", "toolchain"):
        assert section in out
    assert "no entry with key" in cli("show", "zzzz", "-d", warmed, code=1).output
    assert "ambiguous" in cli("show", "", "-d", warmed, code=1).output


def test_show_prints_a_program(warmed):
    (key,) = sorted(set(keys_of(warmed)) - set(recipe_keys(warmed)))
    doc = cli_json("show", key, "-d", warmed)
    assert doc["kind"] == "program" and doc["mode"] == "inference" and doc["symbols"] == ["s0"]
    assert [g["kind"] for g in doc["graphs"]] == ["inference"] and doc["graphs"][0]["nodes"] > 0
    assert "contract" in cli("show", key, "-d", warmed).output


def test_show_does_not_count_as_a_hit(warmed):
    before = cli_json("stats", "-d", warmed)["hits"]
    cli("show", keys_of(warmed)[0], "-d", warmed)
    assert cli_json("stats", "-d", warmed)["hits"] == before


def test_stats_and_zero(tmp_path, tiny_file, warmed):
    cli("warm", tiny_file, "-d", warmed)  # all hits
    doc = cli_json("stats", "-d", warmed)
    assert doc["entries"] == 3 and doc["hits"] >= 2 and doc["compile_time_saved_s"] > 0
    assert "compile time saved" in cli("stats", "-d", warmed).output
    cli("stats", "-d", warmed, "--zero")
    assert cli_json("stats", "-d", warmed)["hits"] == 0


def test_explain_names_the_differing_parts(warmed):
    a, b = recipe_keys(warmed)
    doc = cli_json("explain", a[:8], b[:8], "-d", warmed)
    assert [row["part"] for row in doc["differ"]] == ["bucket"]
    assert "bucket" in cli("explain", a, b, "-d", warmed).output
    assert "same key parts" in cli("explain", a, a, "-d", warmed).output


# -- changing ------------------------------------------------------------------------------------------

def test_evict_plans_then_honours_dry_run_confirmation_and_filters(warmed):
    keys = keys_of(warmed)
    plan = cli_json("evict", "-d", warmed, "--max-size", "0", "--dry-run")
    assert len(plan["plan"]) == 3 and keys_of(warmed) == keys
    assert "Would evict 3 entries" in cli("evict", "-d", warmed, "--max-size", "0", "--dry-run").output
    out = cli("evict", "-d", warmed, "--key", keys[0][:8], input="n\n").output
    assert "Nothing changed" in out and keys_of(warmed) == keys
    assert "Nothing to evict" in cli("evict", "-d", warmed, "--older-than", "7d").output
    assert "Nothing to evict" in cli("evict", "-d", warmed, "--model", "other", "--yes").output
    assert "Evicted 1 entry" in cli("evict", "-d", warmed, "--key", keys[0][:8], input="y\n").output
    assert keys_of(warmed) == keys[1:]
    cli("evict", "-d", warmed, "--model", "tiny", "--yes")
    assert keys_of(warmed) == []
    assert "expected a size" in cli("evict", "-d", warmed, "--max-size", "lots", code=2).output


def test_clear_asks_unless_yes(warmed):
    assert "Nothing changed" in cli("clear", "-d", warmed, input="n\n").output
    assert len(keys_of(warmed)) == 3
    assert "Removed 3 entries" in cli("clear", "-d", warmed, "--yes").output
    assert keys_of(warmed) == []


def test_verify_finds_damage_and_payloads_that_are_not_recipes(warmed):
    assert cli_json("verify", "-d", warmed) == {"entries": 3, "bad": 0, "fixed": False, "problems": []}
    victim = next((warmed / "entries").rglob(keys_of(warmed)[0] + "*"))
    data = bytearray(victim.read_bytes())
    data[-20] ^= 0xFF
    victim.write_bytes(bytes(data))
    cache = RecipeCache(CacheConfig(warmed, max_size_mb=100))
    cache.put("notarecipe", b"\x01\x02 not msgpack of a recipe", {"model": "x"}, wait=True)
    doc = cli_json("verify", "-d", warmed, code=1)
    assert doc["bad"] == 2 and {p["entry"] for p in doc["problems"]} >= {"notarecipe"}
    assert "verify --fix" in cli("verify", "-d", warmed, code=1).output
    assert cli_json("verify", "-d", warmed, "--fix")["fixed"] is True
    assert cli_json("verify", "-d", warmed) == {"entries": 2, "bad": 0, "fixed": False, "problems": []}


def test_export_import_round_trip_and_coverage(tmp_path, tiny_file, warmed):
    bundle = tmp_path / "tiny.tar"
    assert cli_json("export", bundle, "-d", warmed, "--model", "tiny")["entries"] == 3
    target = tmp_path / "imported"
    doc = cli_json("import", bundle, "-d", target)
    assert (doc["imported"], doc["present"], doc["manifests"]) == (3, 0, 1)
    assert keys_of(target) == keys_of(warmed) and read_manifests(target)[0]["model"] == "tiny"
    cli("coverage", tiny_file, "-d", target)
    assert cli_json("import", bundle, "-d", target)["present"] == 3
    assert "no entries for model other" in cli("export", bundle, "-d", warmed, "--model", "other", code=1).output


def _rewrite(bundle, tmp_path, edit):
    out = tmp_path / "edited.tar"
    with tarfile.open(bundle) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            data = edit(member.name, src.extractfile(member).read())
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def test_import_refuses_another_toolchain_unless_forced_and_damaged_entries(tmp_path, warmed):
    bundle = tmp_path / "b.tar"
    cli("export", bundle, "-d", warmed)

    def other_torch(name, data):
        if name != "bundle.json":
            return data
        info = json.loads(data)
        info["toolchain"]["torch"] = "1.0"
        return json.dumps(info).encode()

    foreign = _rewrite(bundle, tmp_path, other_torch)
    out = cli("import", foreign, "-d", tmp_path / "t", code=1).output
    assert "another toolchain" in out and "--force" in out and len(out.strip().splitlines()) == 1
    assert cli_json("import", foreign, "-d", tmp_path / "t", "--force")["imported"] == 3

    def flip(name, data):
        return data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:] if name.startswith("entries/") else data

    out = cli("import", _rewrite(bundle, tmp_path, flip), "-d", tmp_path / "u", code=1).output
    assert "fails its check" in out
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert "not a bundle" in cli("import", tmp_path / "junk.tar", "-d", tmp_path / "u", code=1).output


def test_usage_errors_exit_2(tmp_path):
    assert "color" in cli("ls", "--sort", "color", code=2).output
    assert "Missing argument" in cli("warm", code=2).output


NO_TORCH_RUNNER = """
import sys
from hpurecipe.main import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("torch imported" if "torch" in sys.modules else "no torch", code, file=sys.stderr)
"""


@pytest.mark.e2e
def test_cache_only_commands_do_not_import_torch(tmp_path, warmed):
    import subprocess
    import sys

    a, b = keys_of(warmed)[:2]
    bundle = tmp_path / "b.tar"
    commands = [["ls"], ["show", a], ["stats"], ["verify"], ["explain", a, b], ["export", bundle],
                ["import", bundle, "-d", tmp_path / "other"], ["evict", "--older-than", "1000d", "--yes"],
                ["clear", "--yes"], ["--help"]]
    for args in commands:
        full = [*map(str, args)] + (["-d", str(warmed)] if "-d" not in args and args != ["--help"] else [])
        proc = subprocess.run([sys.executable, "-c", NO_TORCH_RUNNER, *full], capture_output=True, text=True,
                              timeout=120)
        assert proc.stderr.strip().splitlines()[-1] == "no torch 0", (args, proc.stderr[-2000:])


def test_analyze_finds_the_largest_batch_by_searching_the_memory_plan(tiny_file):
    from hpu_backend.diagnosis.analyze import _peak_at, _same_graphs, _scaled_graphs

    from hpu_backend.shipping.warm import plan
    from hpu_backend.modelfiles.modelfile import load_model_file

    doc = cli_json("analyze", tiny_file)
    best, hbm = doc["max_batch"]["batch"], doc["hbm_bytes"]
    points = plan(load_model_file(tiny_file))
    p0, p1 = _same_graphs(points)
    scaled = _scaled_graphs(p0, p1, p0.point["batch"], p1.point["batch"])
    assert _peak_at(scaled, best) <= hbm < _peak_at(scaled, best + 1)  # the boundary, not an extrapolation
    recipe = p1.used[0].recipe  # re-planning at the recipe's own sizes gives its stored plan
    assert len(p1.used) == 1
    (sym, value), = recipe.facts["plan_at"].items()
    (a, c), = (lines[sym] for r, lines in scaled if r is recipe)
    assert (value - c) % a == 0 and _peak_at(scaled, (value - c) // a) == recipe.facts["memory"]["peak_bytes"]


def test_analyze_says_when_it_cannot_find_the_largest_batch(tmp_path):
    static = tiny_model(tmp_path, "static", TINY.replace('"dynamic": True', '"dynamic": False'))
    mb = cli_json("analyze", static)["max_batch"]
    assert mb["batch"] is None and "dynamic shapes" in mb["reason"]


@pytest.mark.e2e
def test_signed_bundles_with_a_key_and_refusals_without_a_match(tmp_path, warmed, monkeypatch):
    unsigned = tmp_path / "unsigned.tar"
    cli("export", unsigned, "-d", warmed)
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", "team secret")
    signed = tmp_path / "signed.tar"
    assert cli_json("export", signed, "-d", warmed)["signed"] is True
    doc = cli_json("import", signed, "-d", tmp_path / "a")
    assert doc["imported"] == len(keys_of(warmed)) and doc["signature_checked"] is True
    assert "not signed" in cli("import", unsigned, "-d", tmp_path / "b", code=1).output
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", "another key")
    assert "signature does not match" in cli("import", signed, "-d", tmp_path / "c", code=1).output
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", "team secret")

    def edit_info(name, data):  # bundle.json changed after signing
        return data if name != "bundle.json" else data.replace(b'"manifests"', b'"manifests" ', 1)
    assert "signature does not match" in cli("import", _rewrite(signed, tmp_path, edit_info), "-d",
                                             tmp_path / "d", code=1).output
    monkeypatch.delenv("HPURECIPE_BUNDLE_KEY")
    assert cli_json("import", signed, "-d", tmp_path / "e")["signature_checked"] is False  # no key: not checked


def test_version_names_the_recipe_format_show_prints(warmed):
    """A user compared `--version` with `show`: one said "recipe entry format 1", the other recipe_format=2."""
    import re

    from hpu_backend.version import __version__

    version = cli("--version").output
    assert version.startswith(f"hpurecipe {__version__} ")
    shown = re.search(r"recipe_format=(\d+)", cli("show", recipe_keys(warmed)[0], "-d", warmed).output).group(1)
    assert re.search(r"recipe_format (\d+)", version).group(1) == shown and "cache entry format" in version


def test_units_are_spelled_one_way(warmed, tiny_file):
    import re

    key = keys_of(warmed)[0]
    outputs = [cli(*args).output for args in (["ls", "-d", warmed], ["stats", "-d", warmed], ["show", key, "-d",
                                                                                              warmed],
                                              ["analyze", tiny_file])]
    text = "\n".join(line for out in outputs for line in out.splitlines() if "sources" not in line)  # quoted specs
    assert re.search(r"\d (KiB|MiB|GiB)\b", text) and "µs" in text
    assert not re.search(r"\d (KB|MB|GB|TB|us)\b", text), text
