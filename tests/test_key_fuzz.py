"""A fast sample of the key fuzzer (bench/key_fuzz.py): one mutation of every kind, no wrong hit, no result unlike
eager, and needless misses only of the kinds the fuzzer names as by design; and the fuzzer itself catches a
key made too weak."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch._dynamo

from cli_helpers import cli, cli_json, one_line, tiny_model
from conftest import ROOT
from hpu_backend.formats import keyparts
from hpu_backend.metrics import metric_localcontext
from hpu_backend.serve.session import Session, listen
from hpu_backend.settings import Settings


@pytest.fixture(scope="module")
def fuzzer():
    spec = importlib.util.spec_from_file_location("hpu_bench_key_fuzz", ROOT / "bench" / "key_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GROUPS = ("graph.", "inputs.", ("state.", "target", "settings", "toolchain."))


@pytest.mark.e2e
@pytest.mark.parametrize("prefix", GROUPS, ids=["graph", "inputs", "state-settings-toolchain"])
def test_one_mutation_of_every_kind_hits_only_what_it_may(fuzzer, prefix, tmp_path):
    kinds = [k for k in fuzzer.MUTATORS if k.startswith(prefix)]
    verdicts = fuzzer.fuzz(len(kinds), seed=7, kinds=kinds, workdir=tmp_path)
    assert [v.kind for v in verdicts] == kinds
    assert [v for v in verdicts if v.wrong_hits] == []
    assert [v for v in verdicts if v.mismatch] == []
    assert [v for v in verdicts if v.needless and not fuzzer.why_needless(v.kind, v.detail)] == []
    # Each mutation that changed what is built missed; each that changed nothing hit (but misses by design).
    for v in verdicts:
        assert v.served_hit != v.changed or fuzzer.why_needless(v.kind, v.detail), v


def test_the_fuzzer_finds_a_wrong_hit_when_the_key_ignores_a_custom_ops_backward(fuzzer, tmp_path, monkeypatch):
    from hpu_backend.serve import keys

    monkeypatch.setattr(keys, "_custom_op_formulas", lambda op: None)  # the key as it was: the op's name only
    verdicts = fuzzer.fuzz(2, seed=3, kinds=["graph.custom_backward"], workdir=tmp_path)
    assert all(v.wrong_hits == ["program"] and v.served_hit for v in verdicts), verdicts


def test_a_needless_miss_is_found_when_the_key_holds_what_the_recipe_ignores(fuzzer, tmp_path, monkeypatch):
    from hpu_backend.serve import keys

    real = keys.settings_fields
    monkeypatch.setattr(keys, "settings_fields", lambda settings, *args: dict(real(settings, *args),
                                                                             model=settings.model))
    custom, warm = _warm(fuzzer, tmp_path)
    labelled = fuzzer.replace(fuzzer.Case(), options=(("model", "another"),))  # a label, stored with entries
    verdict = fuzzer.trial(fuzzer.Case(), "settings", "model", labelled, custom, warm, tmp_path)
    assert not verdict.changed and sorted(verdict.needless) == ["program", "recipe"], verdict


def _warm(fuzzer, tmp_path, case=None):
    import hpu_backend.device as device

    device.enable("eager")
    custom = fuzzer.CustomOp(f"keyfuzz_test_{id(tmp_path)}")
    fuzzer.run_compiled(case or fuzzer.Case(), custom, tmp_path / "warm")
    return custom, tmp_path / "warm"


def test_place_on_cpu_is_keyed_in_a_recipe_only_by_the_names_of_its_ops(fuzzer, tmp_path):
    train = fuzzer.Case(graph=fuzzer.Graph(unary="sigmoid"), inputs=(fuzzer.Input(requires_grad=True), fuzzer.Input()))
    custom, warm = _warm(fuzzer, tmp_path, train)
    placed = fuzzer.replace(train, options=(("place_on_cpu", "aten::sigmoid,aten::digamma"),))
    verdict = fuzzer.trial(train, "settings", "place_on_cpu", placed, custom, warm, tmp_path)
    # The forward runs sigmoid on the CPU now: it missed. Its backward (sigmoid_backward) is the same recipe: no
    # needless miss of it, and no wrong hit of anything.
    assert verdict.changed and not verdict.served_hit and verdict.needless == [] and verdict.wrong_hits == []
    assert verdict.mismatch == ""


# -- every miss says why -----------------------------------------------------------------------------------------

def _tiny(x):
    return torch.relu(x * 2).sum(0)


def _compile(cache, x, **options):
    torch._dynamo.reset()
    options = dict(options, cache_config=f"{cache},false,64")
    session = Session.open(Settings.from_options(options))
    missed = []
    with session.use(), listen(lambda e: missed.append((e.kind, e.missed)) if e.missed else None):
        torch.testing.assert_close(torch.compile(_tiny, backend="hpu_backend", dynamic=False, options=options)(x),
                                   _tiny(x))
    session.flush()
    return missed


def test_a_miss_of_an_entry_held_under_another_key_names_what_differs(tmp_path, monkeypatch, caplog):
    cache, x = tmp_path / "cache", torch.randn(4, 3)
    assert _compile(cache, x) == []  # an empty cache: nothing to explain
    monkeypatch.setattr(keyparts, "torch_version", lambda: "2.13.1")
    with metric_localcontext("cache_misses") as m, caplog.at_level(logging.WARNING, "hpu_backend"):
        missed = _compile(cache, x)
    torch_line = f"torch {torch.__version__} → 2.13.1"
    assert missed == [("program", (torch_line,)), ("take", (torch_line,))]
    assert dict(m.stats()) == {"TotalNumber": 2, "Reasons": {torch_line: 2}}
    assert sum(torch_line in r.getMessage() for r in caplog.records) == 2
    # Another dtype and another target, against the entries already there.
    assert _compile(cache, x.double()) == [("program", ("input 0 dtype torch.float32 → torch.float64",))]
    assert ("take", ("settings.target gaudi2 → gaudi3",)) in _compile(cache, x, target="gaudi3")
    # A new shape of a static graph is another graph (its ops' shapes differ): a plain miss, no warning.
    assert _compile(cache, torch.randn(5, 3)) == []


def test_hpurecipe_explain_miss_names_what_differs(tmp_path, monkeypatch):
    cache, x = tmp_path / "cache", torch.randn(4, 3)
    _compile(cache, x)
    before = {r["key"] for r in cli_json("ls", "-d", cache)}
    _compile(cache, x, target="gaudi3")
    new = {r["key"]: r["kind"] for r in cli_json("ls", "-d", cache) if r["key"] not in before}
    program = next(k for k, kind in new.items() if kind == "program")
    doc = cli_json("explain", program[:10], "--miss", "-d", cache)
    assert doc["kind"] == "program" and doc["nearest"] in before
    assert doc["differ"] == ["settings.target gaudi2 → gaudi3"]
    assert "settings.target gaudi2 → gaudi3" in cli("explain", program, "--miss", "-d", cache).output
    old_program = doc["nearest"]
    assert cli_json("explain", old_program, "--miss", "-d", cache)["differ"] == ["settings.target gaudi3 → gaudi2"]
    lone = tmp_path / "lone"
    _compile(lone, x)
    only = cli_json("ls", "-d", lone)[0]["key"]
    assert "nothing to explain" in cli("explain", only, "--miss", "-d", lone).output
    assert "takes one key" in one_line(cli("explain", only, only, "--miss", "-d", lone, code=1))


def test_warm_reports_the_misses_it_explains(tmp_path, monkeypatch):
    model, cache = tiny_model(tmp_path), tmp_path / "cache"
    assert "missed" not in cli_json("warm", model, "-d", cache)
    monkeypatch.setattr(keyparts, "torch_version", lambda: "2.13.1")
    torch._dynamo.reset()  # as in a second process: the model's code is compiled again
    doc = cli_json("warm", model, "-d", cache)
    assert doc["compiled"] > 0 and doc["missed"], doc
    assert all(f"torch {torch.__version__} → 2.13.1" in line for line in doc["missed"])
    assert any(p["missed"] for p in doc["points"])


def test_a_bundle_says_how_many_of_its_entries_can_hit_before_it_is_copied(tmp_path, monkeypatch):
    model, cache = tiny_model(tmp_path), tmp_path / "cache"
    cli("warm", model, "-d", cache)
    entries = len(cli_json("ls", "-d", cache))
    cli("export", tmp_path / "old.tar", "-d", cache)
    # Another torch here: the bundle is refused with the count of its usable entries, and nothing is copied.
    monkeypatch.setattr(keyparts, "torch_version", lambda: "2.99.0")
    line = one_line(cli("import", tmp_path / "old.tar", "-d", tmp_path / "other", code=1))
    assert f"0 of {entries} entries usable here: built with torch {torch.__version__} (here 2.99.0)" in line
    assert not (tmp_path / "other").exists() or cli_json("ls", "-d", tmp_path / "other") == []
    # A bundle of this toolchain that also carries entries of the other: a warning with the count, then the copy.
    torch._dynamo.reset()
    cli("warm", model, "-d", cache)  # the same model under torch 2.99.0: entries of both toolchains
    monkeypatch.undo()
    cli("export", tmp_path / "mixed.tar", "-d", cache)
    result = cli("import", tmp_path / "mixed.tar", "-d", tmp_path / "mixed")
    total = len(cli_json("ls", "-d", cache))
    assert f"{entries} of {total} entries usable here: built with torch 2.99.0 (here {torch.__version__})" \
        in " ".join(result.output.split())


def test_the_run_report_has_a_line_for_misses_it_explains():
    from hpu_backend.run import report

    lines = report.render({"script": "s.py", "exit_code": 0, "wall_s": 1.0, "steps": [{"ops": 4}],
                           "cache_missed": {"torch 2.13.0 → 2.13.1": 3}})  # a run with device work
    assert any("torch 2.13.0 → 2.13.1 ×3" in line for line in lines)
    assert not any("another key" in line for line in report.render({"script": "s.py"}))


# -- a custom op's formulas, keyed by their code -------------------------------------------------------------------

FORMULA = '''
def backward(ctx, grad):
    if ctx.mode in {"alpha", "beta", "gamma", "delta"}:
        return grad * (2, 3)[0]
    return grad.neg()
'''

DIGEST = f'''
from hpu_backend.serve.keys import _code_digest
space = {{}}
exec({FORMULA!r}, space)
print(_code_digest(space["backward"]))
'''


@pytest.mark.e2e
def test_a_formulas_key_is_the_same_in_every_process_and_follows_its_code():
    from hpu_backend.serve.keys import _code_digest

    space: dict = {}
    exec(FORMULA, space)
    here = _code_digest(space["backward"])
    env = dict(os.environ, PYTHONHASHSEED="12345")  # set literals iterate in another order there
    other = subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip() == here
    edited: dict = {}
    exec(FORMULA.replace("(2, 3)[0]", "(2, 3)[1]"), edited)
    assert _code_digest(edited["backward"]) != here


def test_a_change_of_the_op_table_is_a_change_of_the_recipe_key(monkeypatch):
    """A recipe placed by another op table (an op that is no longer a CPU fallback) is not served: the table's
    digest is part of the toolchain the key holds, and a miss names it."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from hpu_backend.lowering import LoweringContext, lower, optable
    from hpu_backend.serve import keys
    from hpu_backend.settings import Settings

    gm = make_fx(lambda a: (torch.relu(a) + 1,), tracing_mode="fake")(torch.randn(4, 4))
    settings = Settings.from_options({"cache": False, "execute": False}, env={})
    recipe = lower(gm, LoweringContext(settings=settings)).captured
    before = keys.graph_key(recipe, settings)
    fewer = optable.OpTable([r for r in optable.default_table().records.values() if r.op != "relu"])
    monkeypatch.setattr(keys, "shared_table", lambda: fewer)
    after = keys.graph_key(recipe, settings)
    assert before.parts["toolchain"] != after.parts["toolchain"] and before.parts["graph"] == after.parts["graph"]
    assert before.detail["toolchain"]["op_table"] != after.detail["toolchain"]["op_table"]
