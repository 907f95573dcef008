"""End-to-end behaviour of the backend entry point: registration, options, fallback and strict mode."""

from __future__ import annotations

import logging

import pytest
import torch

from hpu_backend import Settings, SettingsError
from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.lowering import LoweringError
from conftest import run_python


@pytest.mark.e2e
def test_entry_point_needs_no_import():
    out = run_python(
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 4); x = torch.randn(2, 4)\n"
        "y = torch.compile(m, backend='hpu_backend')(x)\n"
        "torch.testing.assert_close(y, m(x))\n"
        "from torch._dynamo.backends.registry import lookup_backend\n"
        "print(lookup_backend('hpu_backend').__module__)\n"
    )
    assert out.strip() == "hpu_backend.backend"


@pytest.mark.e2e
def test_alias_hpu_sim_and_existing_registration_do_not_crash():
    out = run_python(
        "import torch\n"
        "from torch._dynamo.backends.registry import register_backend, lookup_backend\n"
        "def other(gm, ex, **kw): return gm.forward\n"
        "register_backend(other, name='hpu_backend')  # as habana_frameworks would\n"
        "import hpu_backend\n"
        "print(lookup_backend('hpu_backend').__name__, lookup_backend('hpu_sim').__module__)\n"
        "m = torch.nn.Linear(3, 3); x = torch.randn(2, 3)\n"
        "torch.testing.assert_close(torch.compile(m, backend='hpu_sim')(x), m(x))\n"
    )
    assert out.split() == ["other", "hpu_backend.backend"]


def test_unknown_option_lists_valid_ones():
    with pytest.raises(SettingsError, match="unknown hpu_backend option.*'colour'.*valid options: strict"):
        Settings.from_options({"colour": "blue"})
    with pytest.raises(SettingsError, match="option 'target' must be one of"):
        Settings.from_options({"target": "gaudi9"})
    with pytest.raises(SettingsError, match="option 'fusion' must be a boolean"):
        Settings.from_options({"fusion": "maybe"})


@pytest.mark.parametrize("buckets", ["foo:3", {"s0": "exp:2", "*": "lin"}])
def test_a_bucket_typo_is_an_error_at_the_call_and_nothing_runs_eagerly(caplog, buckets):
    from torch._dynamo.exc import BackendCompilerFailed

    model = torch.nn.Linear(4, 4)
    compiled = torch.compile(model, backend="hpu_backend", options={"buckets": buckets, "cache": False})
    with caplog.at_level(logging.WARNING), collect_recipes() as found, pytest.raises(BackendCompilerFailed) as e:
        compiled(torch.randn(2, 4))
    assert isinstance(e.value.inner_exception, SettingsError)
    assert "option 'buckets'" in str(e.value.inner_exception) and "forms: exact" in str(e.value.inner_exception)
    assert found == [] and "eagerly" not in caplog.text
    torch._dynamo.reset()


def test_settings_precedence_and_gaudi_env():
    env = {"PT_HPU_USE_EAGER_FALLBACK": "0", "HPU_BACKEND_TARGET": "gaudi3", "PT_HPU_PLACE_ON_CPU": "add, mul"}
    s = Settings.from_options({"target": "gaudi2"}, env=env)
    assert (s.strict, s.target, s.place_on_cpu) == (True, "gaudi2", frozenset({"add", "mul"}))
    assert "strict" not in s.key_fields() and s.key_fields()["place_on_cpu"] == ["add", "mul"]


def test_the_cache_configuration_is_parsed_once_into_the_settings(tmp_path):
    from recipecache import CacheConfig
    from recipecache.config import ENV_VAR

    s = Settings.from_options({}, env={ENV_VAR: f"{tmp_path},true,3"})
    assert (s.cache_config.path, s.cache_config.delete_on_start, s.cache_config.max_size_mb) == (tmp_path, True, 3)
    given = CacheConfig(path=tmp_path, max_size_mb=5)
    assert Settings.from_options({"cache_config": given}, env={ENV_VAR: "/elsewhere,false,1"}).cache_config is given
    assert Settings.from_options({"cache_config": ""}, env={}).cache_config is None
    with pytest.raises(SettingsError, match="max_size_mb"):
        Settings.from_options({"cache_config": f"{tmp_path},false,lots"})


def test_fallback_and_strict_on_a_real_lowering_failure(monkeypatch, caplog):
    from hpu_backend.runtime import ops

    monkeypatch.setattr(ops, "DENY_ATEN", ops.DENY_ATEN | {"sin"})
    ops.resolve.cache_clear()
    try:
        f = lambda x: (x * 2).sin()  # noqa: E731
        x = torch.randn(3)
        with caplog.at_level(logging.WARNING, logger="hpu_backend"):
            torch.testing.assert_close(torch.compile(f, backend="hpu_backend")(x), f(x))
        warnings = [r.getMessage() for r in caplog.records if "could not lower" in r.getMessage()]
        assert len(warnings) == 1 and "fx_graph_" in warnings[0] and "aten::sin.default" in warnings[0]
        torch._dynamo.reset()
        with pytest.raises(Exception, match="aten::sin.default"):
            torch.compile(f, backend="hpu_backend", options={"strict": True})(x)
    finally:
        ops.resolve.cache_clear()


def test_lowering_error_names_pass_node_and_source(monkeypatch, tmp_path):
    from hpu_backend.lowering import pipeline as lowering

    def exploding(recipe, ctx):
        raise LoweringError("boom", node=next(n for n in ctx.gm.graph.nodes if n.op == "call_function"))

    monkeypatch.setattr(lowering, "GRAPH_PASSES", [exploding])
    # a cache of its own: another test of the worker may have stored this very graph's program (then nothing lowers)
    options = {"strict": True, "cache_config": f"{tmp_path / 'recipes'},false,64"}
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x.cos() + 1, backend="hpu_backend", options=options)(torch.randn(2))
    msg = str(info.value)
    assert "boom" in msg and "in pass 'exploding'" in msg and "after: capture" in msg
    assert "at node: %cos" in msg and "test_backend.py" in msg


def test_recipes_name_source_lines_portably(tmp_path, monkeypatch):
    """A recipe's source lines do not carry the checkout's absolute path, so two checkouts build the same bytes."""
    from hpu_backend.lowering.passes.capture import portable_path

    with collect_recipes() as found:
        torch.compile(lambda x: x.cos() + 1, backend="hpu_backend")(torch.randn(2))
    sources = {n.source for _, r, _ in found for n in r.nodes if n.source}
    assert sources and all(s.split(":")[0].endswith("test_backend.py") and not s.startswith("/") for s in sources)
    monkeypatch.chdir(tmp_path)
    assert portable_path(str(tmp_path / "models" / "m.py")) == "models/m.py"
    assert portable_path(torch.__file__) == "torch/__init__.py"  # under a sys.path entry
    assert portable_path("/nowhere/m.py") == "/nowhere/m.py" and portable_path("m.py") == "m.py"


def test_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 8)
    with collect_recipes() as found:
        torch.compile(model, backend="hpu_backend")(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert sorted(r.kind for _, r, _ in found) == ["backward", "forward"]


def test_recipe_records_inputs_outputs_and_name():
    with collect_recipes() as found:
        with torch.no_grad():
            torch.compile(torch.nn.Linear(4, 3), backend="hpu_backend")(torch.randn(2, 4))
    ((graph, recipe, hit),) = found
    assert recipe.kind == "inference" and recipe.name.startswith("fx_graph_") and recipe.name.endswith("_inf")
    assert [s.shape for s in recipe.inputs if s.kind == "tensor"] == [[3, 4], [3], [2, 4]]
    assert "aten::addmm.default" in {n.op for n in recipe.nodes}
    assert recipe.nodes[-1].out[0].shape == [2, 3]


def test_a_dynamic_graph_whose_bucket_fails_to_lower_runs_eagerly(monkeypatch, caplog):
    """Bucket passes run at the first call of a dynamic graph; a failure there falls back too."""
    from hpu_backend.lowering import pipeline as lowering

    def exploding(recipe, ctx):
        raise LoweringError("no plan for this bucket")

    monkeypatch.setattr(lowering, "BUCKET_PASSES", [*lowering.BUCKET_PASSES, exploding])
    f = lambda x: x.cos() * 3  # noqa: E731
    compiled = torch.compile(f, backend="hpu_backend", dynamic=True, options={"cache": False})
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for n in (5, 9, 30):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), f(x))
    warnings = [r.getMessage() for r in caplog.records if "could not lower" in r.getMessage()]
    assert len(warnings) == 1 and "no plan for this bucket" in warnings[0]
    torch._dynamo.reset()
    strict = torch.compile(f, backend="hpu_backend", dynamic=True, options={"cache": False, "strict": True})
    with pytest.raises(LoweringError, match="no plan for this bucket"):
        strict(torch.randn(5))
