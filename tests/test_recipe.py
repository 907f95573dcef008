"""Recipes as data: bit-exact msgpack round trips, schema checks, the op allowlist, a second process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import msgpack
import pytest
import torch

from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.formats.recipe import FORMAT_VERSION, Recipe, RecipeFormatError
from hpu_backend.runtime import RecipeLoadError, build_callable
from conftest import ROOT


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0, -1.0, 3.0]))

    def forward(self, x):
        y = torch.nn.functional.gelu(self.lin(x)) * self.scale
        return y.softmax(-1), y.view(-1, 5).sum(0), x.shape[0] * 2


def _recipes(dynamic=False, shape=(3, 6)):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(*shape)
    with collect_recipes() as found, torch.no_grad():
        out = torch.compile(net, backend="hpu_backend", dynamic=dynamic)(x)
    return net, x, out, [r for _, r, _ in found]


def test_bytes_round_trip_is_bit_exact():
    for dynamic in (False, True):
        _, _, _, (recipe,) = _recipes(dynamic)
        data = recipe.to_bytes()
        again = Recipe.from_bytes(data)
        assert again == recipe and again.to_bytes() == data
    assert recipe.symbols == ["s0"] and recipe.bucket["s0"][1] >= 3


def test_deserialized_recipe_runs_like_the_original():
    net, x, out, (recipe,) = _recipes(dynamic=True)
    params = [net.lin.weight, net.lin.bias, net.scale]
    loaded = build_callable(Recipe.from_bytes(recipe.to_bytes()))
    original = build_callable(recipe)
    args = _args_for(recipe, params, x)
    a, b = original(list(args)), loaded(list(args))
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    torch.testing.assert_close(a[0], out[0])


def _args_for(recipe, params, x):
    """Inputs in the recipe's order: parameters/buffers, then symbols and the user input."""
    it = iter(params)
    args = []
    for spec in recipe.inputs:
        if spec.kind == "sym":
            args.append(x.shape[0])
        elif list(spec.shape) == [] or spec.shape[0] != "s0":
            args.append(next(it))
        else:
            args.append(x)
    return args


@pytest.mark.e2e
def test_recipe_runs_identically_in_a_second_process(tmp_path):
    net, x, out, (recipe,) = _recipes(dynamic=True)
    (tmp_path / "recipe.bin").write_bytes(recipe.to_bytes())
    torch.save({"args": _args_for(recipe, [net.lin.weight.detach(), net.lin.bias.detach(), net.scale], x)},
               tmp_path / "args.pt")
    code = (
        "import sys, torch\n"
        "from hpu_backend.formats.recipe import Recipe\n"
        "from hpu_backend.runtime import build_callable\n"
        "d = sys.argv[1]\n"
        "run = build_callable(Recipe.from_bytes(open(d + '/recipe.bin', 'rb').read()))\n"
        "torch.save(run(torch.load(d + '/args.pt')['args']), d + '/out.pt')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=ROOT, env=os.environ)
    theirs = torch.load(tmp_path / "out.pt")
    ours = build_callable(recipe)(_args_for(recipe, [net.lin.weight.detach(), net.lin.bias.detach(), net.scale], x))
    assert len(theirs) == len(ours) == 3
    for a, b in zip(theirs, ours):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _raw(recipe: Recipe) -> dict:
    return msgpack.unpackb(recipe.to_bytes(), raw=False)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=FORMAT_VERSION + 1), "format version"),
    (lambda d: d.pop("nodes"), "missing"),
    (lambda d: d.update(evil="x"), "unknown fields"),
    (lambda d: d["nodes"][0].update(args=[{"r": "nowhere"}]), "before it is defined"),
    (lambda d: d["nodes"][0].update(out="tensor"), "expected a list"),
    (lambda d: d.update(kind="sideways"), "kind 'sideways'"),
    (lambda d: d.update(guards=[["__import__", "os"]]), "malformed expression"),
    (lambda d: d["nodes"][-1]["out"][0].update(shape=[["s0", 8]]), "malformed expression"),  # show prints it
    (lambda d: d.update(bucket={"s0": [5]}), "not a \\[lo, hi\\] range"),
    (lambda d: d.update(bucket={"s0": [9, 5]}), "not a \\[lo, hi\\] range"),
    (lambda d: d.update(symbols=["s0"], symbol_sources=[]), "differ in length"),
])
def test_schema_check_rejects_malformed_recipes(mutate, message):
    _, _, _, (recipe,) = _recipes()
    raw = _raw(recipe)
    mutate(raw)
    with pytest.raises(RecipeFormatError, match=message):
        Recipe.from_bytes(msgpack.packb(raw, use_bin_type=True))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", msgpack.packb({"version": 1})])
def test_non_recipes_are_format_errors(data):
    with pytest.raises(RecipeFormatError):
        Recipe.from_bytes(data)


@pytest.mark.parametrize("op", [
    "builtins::eval", "os::system", "aten::from_file.default", "aten::add_.Tensor", "aten::__class__.default",
    "aten::add.out", "aten::save.default", "aten::_print.default", "aten::manual_seed.default", "aten::warn.default",
])
def test_ops_outside_the_allowlist_are_load_errors(op):
    _, _, _, (recipe,) = _recipes()
    bad = dataclasses.replace(recipe, nodes=[dataclasses.replace(recipe.nodes[0], op=op), *recipe.nodes[1:]])
    loaded = Recipe.from_bytes(bad.to_bytes())  # the schema is fine; the op name is the problem
    with pytest.raises(RecipeLoadError, match="allowlist"):
        build_callable(loaded)


def test_stored_strings_are_never_code():
    _, _, _, (recipe,) = _recipes()
    i, node = next((i, n) for i, n in enumerate(recipe.nodes) if "gelu" in n.op)
    for args, kwargs in [
        ([*node.args[:-1], "'); import os; os._exit(3); ('"], node.kwargs),
        (node.args, {"x=1); import os; os._exit(3); f(y": 1}),
        ([{"dtype": "__import__('os')"}], {}),
    ]:
        nodes = list(recipe.nodes)
        nodes[i] = dataclasses.replace(node, args=args, kwargs=kwargs)
        bad = dataclasses.replace(recipe, nodes=nodes)
        try:
            run = build_callable(Recipe.from_bytes(bad.to_bytes()))
        except RecipeLoadError:
            continue
        with pytest.raises((TypeError, RuntimeError)):  # a string argument reaches aten, as a string
            run([torch.randn(s.shape) if s.kind == "tensor" else 3 for s in recipe.inputs])


def test_intermediates_are_freed_at_last_use():
    _, _, _, (recipe,) = _recipes()
    source = build_callable(recipe).source
    body = source.splitlines()
    assert "args.clear()" in source
    first_use = next(i for i, line in enumerate(body) if "= " in line and "v0" in line.split("=", 1)[1])
    # Right after the statement that reads it last (a fast-path call and its retry: four lines).
    assert any(line.strip().startswith("del") and "v0" in line for line in body[first_use:first_use + 5])


def test_transpose_addmm_runs_as_one_linear_with_identical_results():
    from hpu_backend.runtime import executor
    from hpu_backend.runtime.peephole import fold_linear

    net, x, _, (recipe,) = _recipes(dynamic=True)
    folded = fold_linear(recipe)
    assert "aten::linear.default" in {n.op for n in folded} and len(folded) == len(recipe.nodes) - 1
    assert "aten::t.default" not in {n.op for n in folded}
    plain = executor._Codegen(recipe)  # the recipe's ops as recorded, without the fold
    source = plain.render()
    namespace = dict(plain.bound)
    exec(compile(source, "<unfolded>", "exec"), namespace)
    params = [net.lin.weight.detach(), net.lin.bias.detach(), net.scale]
    for a, b in zip(namespace["run"](_args_for(recipe, params, x)),
                    build_callable(recipe)(_args_for(recipe, params, x))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_copy_written_back_into_a_view_runs_as_one_copy_into_it():
    """``copy(a, src)`` then ``copy_(a, ·)``: a lazy graph that fills a slice of a flat buffer (DeepSpeed's gradient
    bucket). Run as recorded, the functional copy duplicates the slice's whole storage; folded, it writes ``src``
    into the slice directly, with the same values in the buffer."""
    from hpu_backend.formats.recipe import Node, Recipe, ValueSpec
    from hpu_backend.runtime import executor
    from hpu_backend.runtime.peephole import fold_linear

    n = 8

    def spec(shape):
        return ValueSpec("tensor", "float32", [shape], [1])

    nodes = [Node("v0", "aten::slice.Tensor", [{"r": "src"}, 0, 0, n], {}, [spec(n)]),
             Node("v1", "aten::copy.default", [{"r": "part"}, {"r": "v0"}, False], {}, [spec(n)]),
             Node("v2", "aten::mul.Tensor", [{"r": "src"}, 2.0], {}, [spec(2 * n)]),
             Node("v3", "aten::copy_.default", [{"r": "part"}, {"r": "v1"}], {}, [spec(n)])]
    recipe = Recipe("lazy_graph_copy", "lazy", "gaudi2", [spec(n), spec(2 * n)], ["part", "src"], nodes,
                    [{"r": "v2"}], writes=["part"])
    assert [node.op for node in fold_linear(recipe)] == ["aten::slice.Tensor", "aten::mul.Tensor",
                                                         "aten::copy_.default"]

    def run(build):
        flat, src = torch.zeros(1 << 16), torch.arange(2.0 * n)
        (out,) = build(recipe)([flat[:n], src])
        return flat, out

    plain = executor._Codegen(recipe)  # the ops as recorded, without the fold
    source = plain.render()
    namespace = dict(plain.bound)
    exec(compile(source, "<unfolded>", "exec"), namespace)
    for got, want in zip(run(build_callable), run(lambda _: namespace["run"])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    flat, _ = run(build_callable)
    torch.testing.assert_close(flat[:n], torch.arange(float(n)))

    nodes[2] = Node("v2", "aten::add_.Tensor", [{"r": "src"}, 1.0], {}, [spec(2 * n)])  # a write in between
    written = dataclasses.replace(recipe, nodes=nodes, writes=["part", "src"])
    assert "aten::copy.default" in [node.op for node in fold_linear(written)]
