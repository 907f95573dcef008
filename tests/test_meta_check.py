"""A stored recipe runs on meta tensors at the call's input signature before it runs for real: a node whose
declared shape, dtype or strides differ from what its op makes, an op handed shapes its kernel refuses, or an
op with no meta kernel, is a cache miss (quarantined, lowered again, matching eager), never a host kernel
handed shapes it trusts; genuine entries still serve, and recipes lowered in this process are not checked."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
import torch

from conftest import run_python
from hpu_backend import metrics
from hpu_backend.formats.recipe import Recipe
from hpu_backend.runtime import RecipeLoadError
from hpu_backend.runtime import metacheck
from hpu_backend.runtime.metacheck import check_call
from hpu_backend.serve.session import Session
from hpu_backend.settings import Settings
from test_declared_writes import _compiled_run
from test_programs import _keys, _rewrite


def _spec(shape, dtype="float32", stride=()):
    return {"kind": "tensor", "dtype": dtype, "shape": list(shape), "stride": list(stride), "expr": None,
            "device": "cpu"}


def _node(name, op, args, shape, dtype="float32", stride=()):
    return {"name": name, "op": op, "args": args, "kwargs": {}, "out": [_spec(shape, dtype, stride)],
            "placement": "hpu", "engine": "tpc", "cluster": -1, "fusion": -1, "source": ""}


def _recipe(shapes, nodes) -> Recipe:
    names = [f"t{i}" for i in range(len(shapes))]
    return Recipe.from_plain({"name": "crafted", "kind": "inference", "target": "gaudi2",
                              "inputs": [_spec(s) for s in shapes], "input_names": names,
                              "nodes": nodes, "outputs": [{"r": nodes[-1]["name"]}], "version": 2})


A, B = {"r": "t0"}, {"r": "t1"}


@pytest.mark.parametrize("nodes, words", [
    ([_node("mm", "aten::mm.default", [A, B], [2, 5])], "must have same reduction dim"),  # inner dims 4 and 3
    ([_node("mm", "aten::mm.default", [A, {"r": "t2"}], [2, 9]), _node("r", "aten::relu.default", [{"r": "mm"}],
                                                                     [2, 9])], "declares float32[2, 9], makes"),
    ([_node("s", "aten::select.int", [A, 0, 7], [4])], "out of range"),
    ([_node("c", "aten::_to_copy.default", [A], [2, 4]), _node("r", "aten::relu.default", [{"r": "c"}], [2, 4])],
     "declares float32[2, 4], makes float64[2, 4]"),  # _to_copy keeps the dtype: float64 arrives
    ([_node("n", "aten::nonzero.default", [A], [3, 2], dtype="int64")], "nonzero"),  # the data decides its size
    # geqrf has no meta kernel: its declared results stand in, and the node reading them finds them wrong
    ([{**_node("q", "aten::geqrf.default", [{"r": "t2"}], [4, 5]), "out": [_spec([4, 5]), _spec([9])]},
      _node("g", "operator::getitem", [{"r": "q"}, 1], [9]),
      _node("m", "aten::mul.Tensor", [{"r": "g"}, {"r": "t1"}], [3, 5])], "Attempting to broadcast"),
])
def test_a_recipe_that_does_not_fit_its_inputs_is_refused_on_meta_tensors(nodes, words):
    recipe = _recipe([[2, 4], [3, 5], [4, 5]], nodes)
    args = [torch.zeros(2, 4), torch.zeros(3, 5), torch.zeros(4, 5)]
    if nodes[0]["name"] == "c":
        args[0] = args[0].double()
    with pytest.raises(RecipeLoadError, match=re.escape(words)) as e:
        check_call(recipe, args)
    assert "\n" not in str(e.value)


def test_a_recipe_that_fits_passes_and_the_check_runs_no_kernel():
    recipe = _recipe([[2, 4], [4, 5]], [_node("mm", "aten::mm.default", [A, B], [2, 5], stride=[5, 1]),
                                        _node("q", "aten::geqrf.default", [{"r": "mm"}], [2, 5]),  # no meta kernel
                                        _node("g", "operator::getitem", [{"r": "q"}, 0], [2, 5]),
                                        _node("r", "aten::relu.default", [{"r": "g"}], [2, 5])])
    recipe.nodes[1].out.append(dataclasses.replace(recipe.nodes[1].out[0], shape=[2]))
    x, w = torch.randn(2, 4), torch.randn(4, 5)
    before = x.clone(), w.clone()
    check_call(recipe, [x, w])
    assert torch.equal(x, before[0]) and torch.equal(w, before[1])


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 6), torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _first(raw, prefix):
    return next(n for n in raw["nodes"] if n["op"].startswith(prefix))


def _bad_inner_dims(raw):
    """The first matrix product takes the weight untransposed: [5, 8] times [6, 8]."""
    _first(raw, "aten::addmm")["args"][2] = {"r": raw["input_names"][0]}


def _understated(raw):
    """The relu declares a result smaller than it makes."""
    node = _first(raw, "aten::relu")
    node["out"][0]["shape"] = [1, 1]


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A cache holding the model's program and bucket recipe (batch 5), and the eager reference."""
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(5, 8)
    cache = tmp_path_factory.mktemp("meta") / "c"
    with torch.no_grad():
        _compiled_run(cache, model, x)
        return cache, model, x, model(x)


@pytest.fixture
def cache(warmed, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(warmed[0], copy)
    return copy


@pytest.mark.parametrize("mutate", [_bad_inner_dims, _understated], ids=["inner_dims", "understated"])
def test_a_stored_recipe_whose_shapes_disagree_is_a_quarantined_miss(warmed, cache, mutate, caplog):
    _, model, x, expected = warmed
    (key,) = _keys(cache, programs=False)
    _rewrite(cache, key, mutate)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend"):
        torch.testing.assert_close(_compiled_run(cache, model, x), expected)
    assert any("does not fit this call" in r.getMessage() for r in caplog.records), caplog.text
    assert len(list((cache / "quarantine").iterdir())) == 1


def test_a_genuine_stored_recipe_is_checked_and_matches_eager(warmed, cache, caplog):
    _, model, x, expected = warmed
    before = metrics.phase_times().get("check", 0.0)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend"):
        torch.testing.assert_close(_compiled_run(cache, model, x), expected)
    assert metrics.phase_times().get("check", 0.0) > before  # the stored recipe was checked ...
    assert not (cache / "quarantine").exists() or not any((cache / "quarantine").iterdir())
    assert not caplog.records, caplog.text  # ... and served


def test_the_verdict_is_kept_per_input_signature(tmp_path, monkeypatch):
    """One check per (recipe, signature): a size seen before is not checked again, a new size in the same bucket is."""
    torch.manual_seed(0)
    model = Mlp()
    with torch.no_grad():
        _compiled_run(tmp_path / "c", model, torch.randn(5, 8), dynamic=True)  # stores the bucket holding 5 and 6
    checked = []
    monkeypatch.setattr(metacheck, "check_call", lambda recipe, args: checked.append(  # the symbol value passed
        [a for a in args if isinstance(a, int)]))
    torch._dynamo.reset()
    options = {"cache_config": f"{tmp_path / 'c'},false,64"}
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True, options=options)
    with Session.open(Settings.from_options(options)).use(), torch.no_grad():
        for batch in (5, 5, 6, 5, 6):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert checked == [[5], [6]]


def test_a_recipe_lowered_in_this_process_is_not_checked(tmp_path):
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    before = metrics.phase_times().get("check", 0.0)
    with torch.no_grad():
        torch.testing.assert_close(_compiled_run(tmp_path / "c", model, x), model(x))
    assert metrics.phase_times().get("check", 0.0) == before


# A host kernel that trusts its caller: batch norm without running statistics, in eval mode, reads the statistics
# it was not given and crashes the process. The load-time rule that refuses it (``ops.REQUIRED_LITERALS``) is lifted
# here, in a child process: the meta check alone must refuse the node before the kernel runs, or the child dies.
CHILD = """
import torch
from hpu_backend.formats.recipe import Recipe
from hpu_backend.runtime import RecipeLoadError, build_callable, ops
from hpu_backend.runtime import metacheck
from hpu_backend.runtime.metacheck import check_call
from hpu_backend.serve.session import Session
from hpu_backend.settings import Settings
ops.REQUIRED_LITERALS.clear()
spec = lambda s: {"kind": "tensor", "dtype": "float32", "shape": s, "stride": [], "expr": None, "device": "cpu"}
node = {"name": "n", "op": "aten::_native_batch_norm_legit.no_stats", "kwargs": {},
        "args": [{"r": "x"}, {"r": "w"}, {"r": "w"}, False, 1.0, 1.0], "out": [spec([2, 4, 3]), spec([0]), spec([0])],
        "placement": "hpu", "engine": "tpc", "cluster": -1, "fusion": -1, "source": ""}
recipe = Recipe.from_plain({"name": "crafted", "kind": "inference", "target": "gaudi2",
                            "inputs": [spec([2, 4, 3]), spec([4])], "input_names": ["x", "w"], "nodes": [node],
                            "outputs": [{"r": "n"}], "version": 2})
run, args = build_callable(recipe), [torch.ones(2, 4, 3), torch.ones(4)]
try:
    check_call(recipe, args)
except RecipeLoadError as e:
    print("refused:", e)
else:
    run(args)
"""


@pytest.mark.e2e
def test_a_kernel_that_trusts_its_caller_is_never_reached_in_a_child_process():
    out = run_python(CHILD, {})
    assert "refused: does not run on these inputs' shapes" in out, out
