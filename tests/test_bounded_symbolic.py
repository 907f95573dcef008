"""Every symbolic operation is bounded before it computes (integers by MAX_BITS, lists and strings by MAX_ITEMS),
and a stored entry's symbolic nodes are evaluated when it is loaded: a package that breaks a bound or takes an
item out of range is refused by load_package in one line, a cache entry is quarantined; never a hang, a
MemoryError or a traceback at the first call."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import run_python
from hpu_backend import PackageError, load_package
from hpu_backend.formats import symexpr
from hpu_backend.formats.recipe import Recipe
from hpu_backend.runtime import RecipeLoadError, build_callable, ops
from hpu_backend.runtime.symbolic import SymbolicError, symbolic_values
from test_hostile_package import built, crafted, node, recipe, refused, write  # noqa: F401 (built: a fixture)
from test_programs import _compile_and_run, _keys, _quarantined, _rewrite

MAX_BITS, MAX_ITEMS = symexpr.MAX_BITS, symexpr.MAX_ITEMS
SYM_OPS = sorted(name for name in ops.SYM_RUNTIME if name != "higher_order::with_effects")


def _sym(name: str, op: str, args: list) -> dict:
    return node(name, op, args, [], kind="sym", expr=0)


def _mul_chain(length: int) -> list[dict]:
    nodes = [_sym("m0", "operator::mul", [2 ** 62, 2 ** 62])]
    return nodes + [_sym(f"m{i}", "operator::mul", [{"r": f"m{i - 1}"}, {"r": f"m{i - 1}"}]) for i in range(1, length)]


def _user(raw) -> str:
    return recipe(raw)["input_names"][-1]


BAD = {
    "string-repeat": ([_sym("s", "operator::mul", ["ab", 10 ** 9])], "past 4096 items"),
    "list-repeat": ([_sym("s", "operator::mul", [[0, 0], 10 ** 9])], "past 4096 items"),
    "repeat-on-the-left": ([_sym("s", "operator::mul", [10 ** 9, [0]])], "past 4096 items"),
    "doubling-joins": ([_sym("j0", "operator::add", [[0] * 64, [0] * 64])]
                       + [_sym(f"j{i}", "operator::add", [{"r": f"j{i - 1}"}, {"r": f"j{i - 1}"}]) for i in range(1,
                                                                                                                  40)],
                       "past 4096 items"),
    "mul-chain": (_mul_chain(40), "more than 4096 bits"),
    "string-format": ([_sym("f", "operator::mod", ["%0999999999d", 1])], "formatting"),
    "index-out-of-range": ([_sym("i", "operator::getitem", [[1, 2], 5])], "IndexError"),
    "item-of-a-tuple-out-of-range": ([
        node("bn", "aten::native_batch_norm.default", ["USER", None, None, None, None, True, 0.1, 1e-5], [2, 8]),
        _sym("i", "operator::getitem", [{"r": "bn"}, 7])], "returns 3"),
    "dimension-out-of-range": ([_sym("d", "aten::sym_size.int", ["USER", 99])], "dimension 99"),
    "size-chain": ([_sym("n", "aten::sym_size.int", ["USER", 0])]
                   + [_sym(f"p{i}", "operator::mul", [{"r": "n" if i == 0 else f"p{i - 1}"},
                                                      10 ** 18]) for i in range(300)],
                   "more than 4096 bits"),
}


def _insert(raw, nodes: list[dict]) -> None:
    user = {"r": _user(raw)}
    nodes = json.loads(json.dumps(nodes).replace('"USER"', json.dumps(user)))
    recipe(raw)["nodes"][:0] = nodes


@pytest.mark.parametrize("case", list(BAD))
def test_a_package_breaking_a_symbolic_bound_or_index_is_refused_at_load_in_one_line(built, tmp_path, case):
    nodes, match = BAD[case]
    path = crafted(built, tmp_path, lambda raw: _insert(raw, nodes))
    assert match in refused(path), case


PROBE = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a MemoryError here would mean unbounded work
from hpu_backend import PackageError, load_package
out = {}
for path in sys.argv[1:]:
    try:
        load_package(path)
        out[path] = "loaded"
    except PackageError as e:
        out[path] = str(e)
print(json.dumps(out))
"""


def test_symbolic_bombs_are_refused_in_a_process_with_bounded_memory(built, tmp_path):
    paths = [crafted(built, tmp_path, lambda raw, c=c: _insert(raw, BAD[c][0]), f"{c}.hpkg")
             for c in ("string-repeat", "list-repeat", "doubling-joins", "mul-chain")]
    code = PROBE.replace("sys.argv[1:]", repr([str(p) for p in paths]))
    found = json.loads(run_python(code, timeout=120).splitlines()[-1])
    assert all(message != "loaded" and "\n" not in message for message in found.values()), found


def test_a_cache_entry_with_a_symbolic_bomb_is_quarantined_at_load_and_served_fresh(tmp_path, caplog):
    """Refused when read (never run: an 8 GB list would be made before the run could fail)."""
    cache_dir, x = tmp_path / "c", torch.randn(5, 8)
    _compile_and_run(cache_dir, x)
    (key,) = _keys(cache_dir, programs=False)
    _rewrite(cache_dir, key, lambda raw: raw["nodes"].insert(0, _sym("s", "operator::mul", [[0], 10 ** 9])))
    with caplog.at_level("WARNING", logger="hpu_backend"):
        got, want = _compile_and_run(cache_dir, x)
    torch.testing.assert_close(got, want)
    assert _quarantined(cache_dir) == 1
    assert any("cannot be used" in r.getMessage() and "past 4096 items" in r.getMessage() for r in caplog.records)
    assert not any("failed when run" in r.getMessage() for r in caplog.records)


# -- the property: every symbolic operation, chained over literals and sizes, is bounded --------------------------

OPERANDS = st.one_of(
    st.integers(-3, 3), st.integers(-2 ** 63, 2 ** 64 - 1), st.just(2 ** 62), st.floats(allow_nan=False, width=32),
    st.booleans(), st.text(max_size=3), st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from([10 ** 9, 10 ** 18, 4096, 4097, "%s", "%099999d"]))


@st.composite
def sym_chains(draw):
    """A chain of symbolic nodes: each op from the runtime's table, each operand a literal, the batch size or an
    earlier node's value."""
    nodes = [_sym("n", "aten::sym_size.int", ["USER", 0])]
    for i in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(SYM_OPS))
        refs = [{"r": n["name"]} for n in nodes]
        args = draw(st.lists(st.one_of(OPERANDS, st.sampled_from(refs)), min_size=1, max_size=2))
        nodes.append(_sym(f"v{i}", op, args))
    return nodes


def _bounded(value) -> bool:
    if isinstance(value, int):
        return value.bit_length() <= MAX_BITS + 1
    if isinstance(value, (str, bytes, list, tuple)):
        return len(value) <= MAX_ITEMS
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(chain=sym_chains())
def test_any_chain_of_symbolic_operations_is_bounded_or_a_load_error(built, chain):
    raw = copy.deepcopy(recipe(built[1]))
    user = {"r": raw["input_names"][-1]}
    raw["nodes"][:0] = json.loads(json.dumps(chain).replace('"USER"', json.dumps(user)))
    r = Recipe.from_plain(raw)
    for env in ({"s0": 2}, {"s0": 8}, None):
        try:
            values = symbolic_values(r, env)
        except SymbolicError:
            continue
        assert all(_bounded(v) for v in values.values())
    try:
        build_callable(r)
    except RecipeLoadError:
        pass
    _load_and_call_as_a_package(built, chain)


def _load_and_call_as_a_package(built, chain: list[dict]) -> None:
    """The chain in a package: refused at load, or served equal to eager with the caller's weights unchanged."""
    path, raw, spec = built
    raw = copy.deepcopy(raw)
    for r in raw["recipes"]:
        user = {"r": r["input_names"][-1]}
        r["nodes"][:0] = json.loads(json.dumps(chain).replace('"USER"', json.dumps(user)))
    bad = Path(tempfile.mkdtemp()) / "chain.hpkg"
    write(bad, raw)
    model = spec.build_model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        served = load_package(bad, model)
    except PackageError as e:
        assert "\n" not in str(e)
        return
    finally:
        shutil.rmtree(bad.parent)
    for batch in (2, 8):
        x = spec.inputs({"batch": batch})[0]
        with torch.no_grad():
            torch.testing.assert_close(served(x), model(x))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@st.composite
def sym_trees(draw, depth=3):
    """A symexpr tree over every operation of its table."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(st.integers(-2 ** 70, 2 ** 70), st.just("s0"), st.booleans(), st.just(2 ** 4000)))
    op = draw(st.sampled_from(sorted(symexpr.OPS)))
    return [op, *draw(st.lists(sym_trees(depth - 1), min_size=1, max_size=3))]


@settings(max_examples=300, deadline=None)
@given(tree=sym_trees())
def test_any_symbolic_expression_is_bounded_or_a_symexpr_error(tree):
    try:
        value = symexpr.evaluate(tree, {"s0": 7})
    except symexpr.SymExprError:
        return
    assert _bounded(value)


def test_the_bounded_operations_refuse_before_they_compute():
    for op, args in [(symexpr.bounded_mul, (2 ** 4000, 2 ** 200)), (symexpr.bounded_mul, ("x", 10 ** 12)),
                     (symexpr.bounded_mul, (10 ** 12, [1])), (symexpr.bounded_add, ([0] * 4000, [0] * 200)),
                     (symexpr.bounded_pow, (3, 10 ** 6)), (symexpr.bounded_add, (2 ** 5000, 1))]:
        with pytest.raises(OverflowError):
            op(*args)
    with pytest.raises(TypeError):
        symexpr.bounded_mod("%d", 1)
    assert symexpr.bounded_mul([1, 2], 3) == [1, 2] * 3 and symexpr.bounded_mul(-2 ** 100, 2 ** 100) == -2 ** 200
    assert symexpr.evaluate(["mul", "s0", "s0", 3], {"s0": 5}) == 75
    with pytest.raises(symexpr.SymExprError, match="4096 bits"):
        symexpr.evaluate(["mul", *[2 ** 1000] * 6], {})
