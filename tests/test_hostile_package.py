"""Hostile packages: crafted files that try to import code, change the caller's model, pass as signed,
make the loader hang or exhaust memory, or break it with malformed metadata. Each one must end in one
``PackageError`` line (and a failing ``hpurecipe verify``), with nothing imported, written or mutated.

One small package (Linear-ReLU-Linear over a batch axis) is built once; every case edits a copy of it and
makes its checksum valid again, as an attacker who can write the file would.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import sys
import time

import msgpack
import pytest
import torch

from cli_helpers import INPUTS, LINEAR, cli, one_line, tiny_model
from conftest import run_python
from hpu_backend import PackageError, load_package
from hpu_backend.shipping.package import build_package
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.formats import symexpr
from hpu_backend.formats.package import HEADER_BYTES, MAGIC, UNSIGNED, read_package
from recipecache.signing import KEY_ENV

KEY = "team-secret"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The package file, its unpacked payload, and the model file's module."""
    out = tmp_path_factory.mktemp("hostile")
    spec = load_model_file(tiny_model(out))
    path = out / "tiny.hpkg"
    build_package(spec, path, with_weights=True, check=False)
    return path, msgpack.unpackb(path.read_bytes()[HEADER_BYTES:], raw=False), spec


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


def write(dst, raw, tag: bytes = UNSIGNED) -> None:
    """A package file holding ``raw`` with a valid checksum (and the given signature tag)."""
    payload = msgpack.packb(raw, use_bin_type=True)
    dst.write_bytes(MAGIC + hashlib.sha256(payload).digest() + tag + payload)


def crafted(built, tmp_path, change, name: str = "bad.hpkg"):
    raw = copy.deepcopy(built[1])
    change(raw)
    write(tmp_path / name, raw)
    return tmp_path / name


def refused(path, model=None, match: str = "") -> str:
    """The one-line PackageError load_package gives, also a failing ``hpurecipe verify``."""
    with pytest.raises(PackageError) as e:
        load_package(path, model)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and match in message, message
    result = cli("verify", path, code=1)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return message


def recipe(raw, i: int = 0) -> dict:
    return raw["recipes"][i]


def node(name: str, op: str, args: list, shape: list, kind: str = "tensor", expr=None) -> dict:
    out = {"kind": kind, "dtype": "float32" if kind == "tensor" else "", "shape": shape,
           "stride": [], "expr": expr, "device": "cpu"}
    return {"name": name, "op": op, "args": args, "kwargs": {}, "out": [out], "placement": "hpu",
            "engine": "tpc", "cluster": -1, "fusion": -1, "source": ""}


def test_the_untouched_package_loads_and_matches_eager(built):
    """The baseline every case below departs from."""
    path, _, spec = built
    model = spec.build_model().eval()
    x = spec.inputs({"batch": 8})[0]
    with torch.no_grad():
        torch.testing.assert_close(load_package(path)(x), model(x))
    assert "all 2 recipes load" in cli("verify", path).output


# -- 1. nothing named by the file is imported ----------------------------------------------------------------

MARKER = "hpu_hostile_marker"


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """A module that, if ever imported, leaves a file behind."""
    (tmp_path / f"{MARKER}.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n"
                                           "class Hook:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "imported"
    sys.modules.pop(MARKER, None)


def _torch_spec(type_name: str, context: str = "null") -> str:
    """A call spec as torch's pytree JSON would name it: the form that used to be stored."""
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": type_name, "context": context, "children_spec": [leaf]}])


@pytest.mark.parametrize("field, value", [
    ("in_spec", _torch_spec(f"{MARKER}.Hook")),
    ("out_spec", _torch_spec("collections.defaultdict", json.dumps([f"{MARKER}.Hook", []]))),
    ("in_spec", ["tuple", [["enum", [None]], ["dict", [], []]]]),
    ("out_spec", [f"{MARKER}.Hook", [None]]),
    ("in_spec", ["tuple", [["tuple", [None]], ["dict", [{"type": f"{MARKER}.Hook"}], [None]]]]),
    ("out_spec", {"type": f"{MARKER}.Hook", "children_spec": []}),
], ids=["torch-json-module", "defaultdict-factory", "enum-kind", "module-kind", "dict-key-object", "map"])
def test_a_call_spec_naming_a_module_is_refused_and_imports_nothing(built, tmp_path, marker, field, value):
    before = set(sys.modules)
    path = crafted(built, tmp_path, lambda raw: raw.update({field: value}))
    assert f"{field}" in refused(path)
    assert MARKER not in sys.modules and not marker.exists()
    assert not {m for m in set(sys.modules) - before if "marker" in m or m.startswith("enum")}


def test_torchs_pytree_deserializer_is_never_called(built, monkeypatch):
    import torch.utils._pytree as pytree

    def forbidden(*a, **k):
        raise AssertionError("treespec_loads called on stored data")

    monkeypatch.setattr(pytree, "treespec_loads", forbidden)
    x = built[2].inputs({"batch": 2})[0]
    assert load_package(built[0])(x).shape == (2, 4)


def test_a_deeply_nested_call_spec_is_refused_without_recursing(built, tmp_path):
    deep = None
    for _ in range(400):
        deep = ["list", [deep]]
    path = crafted(built, tmp_path, lambda raw: raw.update(out_spec=deep))
    assert "levels" in refused(path)


# -- 2. a package never changes the caller's tensors ---------------------------------------------------------

def _zero_first_weight(raw, op: str = "aten::copy_.default", via_effects: bool = False) -> None:
    r = recipe(raw)
    weight = r["input_names"][0]
    zeros = node("z", "aten::zeros_like.default", [{"r": weight}], [16, 8])
    write_node = node("w", op, [{"r": weight}, {"r": "z"}], [16, 8])
    if via_effects:
        write_node = node("w", "higher_order::with_effects", [None, {"op": op}, {"r": weight}, {"r": "z"}], [],
                          kind="other")
    r["nodes"][:0] = [zeros, write_node]


def _add_into_first_weight(raw) -> None:
    r = recipe(raw)
    weight = r["input_names"][0]
    r["nodes"][:0] = [node("z", "aten::zeros_like.default", [{"r": weight}], [16, 8]),
                      dict(node("w", "aten::add.Tensor", [{"r": "z"}, {"r": "z"}], [16, 8]),
                           kwargs={"out": {"r": weight}})]


@pytest.mark.parametrize("change", [
    pytest.param(lambda raw: _zero_first_weight(raw), id="copy_"),
    pytest.param(lambda raw: _zero_first_weight(raw, via_effects=True), id="copy_-through-with_effects"),
    pytest.param(lambda raw: _zero_first_weight(raw, "aten::_copy_from.default"), id="_copy_from"),
    pytest.param(lambda raw: _add_into_first_weight(raw), id="out="),
])
def test_a_package_that_writes_into_a_weight_is_refused_and_the_model_is_unchanged(built, tmp_path, change):
    model = built[2].build_model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = crafted(built, tmp_path, change)
    message = refused(path, model)
    assert "writes into one of its inputs" in message or "allowlist" in message, message
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


# -- 3. signatures -----------------------------------------------------------------------------------------------

def _relu_to_neg(raw) -> None:
    for r in raw["recipes"]:
        for n in r["nodes"]:
            if n["op"] == "aten::relu.default":
                n["op"] = "aten::neg.default"


def test_a_signed_package_loads_with_the_key_and_an_edited_one_is_refused(built, tmp_path, monkeypatch):
    path, raw, spec = built
    signed = tmp_path / "signed.hpkg"
    monkeypatch.setenv(KEY_ENV, KEY)
    assert ", signed)" in cli("package", spec.path, "-o", signed, "--with-weights", "--no-check").output
    monkeypatch.delenv(KEY_ENV)
    x = spec.inputs({"batch": 8})[0]
    edited = copy.deepcopy(raw)
    _relu_to_neg(edited)
    payload = msgpack.packb(edited, use_bin_type=True)
    tag = read_package(path, key=None).to_bytes(KEY.encode())[len(MAGIC) + 32:HEADER_BYTES]  # the original's
    forged = tmp_path / "forged.hpkg"
    forged.write_bytes(MAGIC + hashlib.sha256(payload).digest() + tag + payload)
    unsigned = crafted(built, tmp_path, _relu_to_neg, "unsigned.hpkg")

    # Without a key nothing is checked: an edited package serves what it says (the documented trust).
    with torch.no_grad():
        assert not torch.allclose(load_package(forged)(x), spec.build_model()(x))

    monkeypatch.setenv(KEY_ENV, KEY)
    with torch.no_grad():
        torch.testing.assert_close(load_package(signed)(x), spec.build_model()(x))
    assert "signature does not match" in refused(forged)
    assert "not signed" in refused(unsigned)
    monkeypatch.setenv(KEY_ENV, "another-key")
    assert "signature does not match" in refused(signed)


# -- 5. bounded work: symbolic powers, allocations -----------------------------------------------------------------

def test_symbolic_arithmetic_refuses_huge_powers_fast():
    start = time.perf_counter()
    for tree in (["pow", 2, ["pow", 10, 18]], ["pow", "s0", 10 ** 18], ["mul", ["pow", 7, 4000], ["pow", 7, 4000]],
                 ["floordiv", "s0", 0], ["max"]):
        with pytest.raises(symexpr.SymExprError):
            symexpr.evaluate(tree, {"s0": 3})
    assert symexpr.evaluate(["pow", "s0", 3], {"s0": 3}) == 27
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("change, match", [
    pytest.param(lambda raw: recipe(raw)["guards"].append(["eq", ["pow", 2, ["pow", 10, 18]], 0]), "guard",
                 id="guard-pow"),
    pytest.param(lambda raw: recipe(raw)["nodes"].insert(0, node(
        "big", "operator::pow", [2, 10 ** 18], [], kind="sym", expr=0)), "more than 4096 bits", id="node-pow"),
    pytest.param(lambda raw: recipe(raw)["nodes"].insert(0, dict(node(
        "big", "aten::full.default", [[65536, 32768], 0.0], [65536, 32768]),
        kwargs={"dtype": {"dtype": "float32"}, "device": {"device": "cpu"}})), "the recipe's memory plan",
        id="8GB-full"),
    pytest.param(lambda raw: recipe(raw)["nodes"].insert(0, node(
        "big", "aten::empty.memory_format", [[65536, 32768]], [1])), "the recipe's memory plan",
        id="8GB-empty-lying-spec"),
    pytest.param(lambda raw: recipe(raw)["nodes"].insert(0, node(
        "big", "aten::zeros.default", [["mul", "s0", 10 ** 9]], [["mul", "s0", 10 ** 9]])), "",
        id="symbolic-size-as-data"),
])
def test_unbounded_work_in_a_package_is_refused_at_load(built, tmp_path, change, match):
    path = crafted(built, tmp_path, change)
    start = time.perf_counter()
    assert match in refused(path)
    assert time.perf_counter() - start < 20


# -- 6/7. regular files only, read in bounded memory -----------------------------------------------------------

PROBE = r"""
import json, os, resource, sys
from hpu_backend import PackageError, load_package
from hpu_backend.formats.package import MAGIC
out = {}
for path in sys.argv[1:]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        load_package(path)
        out[path] = ["loaded", 0]
    except PackageError as e:
        out[path] = [str(e), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before]
print(json.dumps(out))
"""


@pytest.mark.e2e
def test_devices_fifos_and_a_huge_file_are_refused_in_one_line_and_bounded_memory(tmp_path):
    fifo = tmp_path / "fifo.hpkg"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.hpkg"
    with open(huge, "wb") as f:  # sparse: 256 MB with a valid header and a wrong checksum (read whole: +256 MB)
        f.write(MAGIC + b"\1" * 32 + UNSIGNED)
        f.truncate(256 << 20)
    junk = tmp_path / "junk.hpkg"
    with open(junk, "wb") as f:
        f.truncate(1 << 30)
    paths = ["/dev/zero", str(fifo), str(huge), str(junk), str(tmp_path)]
    code = f"import sys; sys.argv[1:] = {paths!r}\n" + PROBE
    out = json.loads(run_python(code, timeout=120).splitlines()[-1])
    expected = ["not a regular file", "not a regular file", "checksum mismatch", "bad magic", ""]
    for path, want in zip(paths, expected):
        message, grew_kb = out[path]
        assert path in message and want in message and "\n" not in message, (path, message)
        assert grew_kb < 64 * 1024, (path, grew_kb)  # ru_maxrss is in KiB on Linux


def test_show_ls_and_verify_of_a_fifo_or_a_device_are_one_line(tmp_path):
    fifo = tmp_path / "fifo.hpkg"
    os.mkfifo(fifo)
    for command in ("show", "ls", "verify"):
        for path in (fifo, "/dev/zero"):
            result = cli(command, path, code=1)
            lines = [line for line in result.output.splitlines() if line.strip()]
            assert len(lines) == 1 and "not a regular file" in lines[0], result.output


# -- 11. the destination of ``package -o`` ----------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_package_never_replaces_a_device_or_a_fifo(tmp_path):
    fifo = tmp_path / "out.hpkg"
    os.mkfifo(fifo)
    model_file = tiny_model(tmp_path)
    for dest in ("/dev/full", fifo, tmp_path):
        result = cli("package", model_file, "-o", dest, code=1)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "not a regular file" in lines[0], result.output
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not [p for p in os.listdir("/dev") if p.startswith(".full")]


# -- 14. every metadata error is one PackageError line ------------------------------------------------------------

def _user_input(raw) -> dict:
    return next(gi for gi in raw["inputs"] if gi["kind"] == "user")


@pytest.mark.parametrize("change", [
    pytest.param(lambda raw: raw.update(recipes=[]), id="no-recipes"),
    pytest.param(lambda raw: _user_input(raw).update(index=7), id="user-index-IndexError"),
    pytest.param(lambda raw: raw.update(ranges={}), id="ranges-missing-KeyError"),
    pytest.param(lambda raw: raw.update(ranges={"s0": [8, 1]}), id="ranges-reversed"),
    pytest.param(lambda raw: raw.update(ranges={"s0": [1, "8"]}), id="ranges-TypeError"),
    pytest.param(lambda raw: raw.update(in_spec='[1, {"type": "builtins.tuple"'), id="spec-JSONDecodeError"),
    pytest.param(lambda raw: raw.update(out_spec=["tuple", [None, None]]), id="out-spec-leaves"),
    pytest.param(lambda raw: recipe(raw)["guards"].append(["floordiv", "s0", 0]), id="guard-ZeroDivisionError"),
    pytest.param(lambda raw: recipe(raw)["guards"].append(["lt", "s9", 3]), id="guard-unbound-symbol"),
    pytest.param(lambda raw: recipe(raw).update(symbol_sources=[[0, 0]]), id="symbol-from-a-weight"),
    pytest.param(lambda raw: recipe(raw).update(bucket={"s0": [100, 200]}), id="bucket-outside-ranges"),
    pytest.param(lambda raw: recipe(raw)["constants"].update(
        k={"dtype": "float32", "shape": [1 << 40], "data": b""}), id="constant-shape-lies"),
    pytest.param(lambda raw: raw.update(toolchain=[]), id="toolchain-not-a-map"),
    pytest.param(lambda raw: raw["weights"].pop(next(iter(raw["weights"]))), id="weight-missing"),
    pytest.param(lambda raw: recipe(raw)["nodes"][0].update(op="aten::relu.default"), id="wrong-op-arity"),
])
def test_malformed_metadata_is_one_package_error_line(built, tmp_path, change):
    refused(crafted(built, tmp_path, change))


def test_a_payload_that_is_not_msgpack_and_an_old_format_are_one_line(built, tmp_path):
    bad = tmp_path / "bad.hpkg"
    payload = b"\xc1" * 100
    bad.write_bytes(MAGIC + hashlib.sha256(payload).digest() + UNSIGNED + payload)
    assert "msgpack" in refused(bad)
    old = tmp_path / "old.hpkg"
    old.write_bytes(MAGIC[:-1] + b"\x01" + built[0].read_bytes()[len(MAGIC):])
    assert "rebuild the package" in refused(old)


def test_verify_runs_the_ops_and_catches_what_a_package_understates(built, tmp_path):
    """Products of the package's own input (no size argument anywhere) that declare [1] but make 64 MB."""
    def chain(raw):
        r = recipe(raw)
        user = r["input_names"][-1]
        r["nodes"][:0] = [node("f1", "aten::view.default", [{"r": user}, [-1]], [1]),
                          node("o1", "aten::outer.default", [{"r": "f1"}, {"r": "f1"}], [1]),
                          node("f2", "aten::view.default", [{"r": "o1"}, [-1]], [1]),
                          node("o2", "aten::outer.default", [{"r": "f2"}, {"r": "f2"}], [1])]

    path = crafted(built, tmp_path, chain)
    result = cli("verify", path, code=1)
    assert "memory plan" in result.output and len(result.output.strip().splitlines()) == 1, result.output


# -- 17. model files: exits, foreign exceptions, hangs, bad options, forward errors ------------------------------

HEAD = 'import sys, time, torch\nAXES = {"batch": [2]}\nCOMPILE = {"dynamic": False, "options": {}}\n'


@pytest.mark.parametrize("text, args, expected", [
    (HEAD + "sys.exit(3)\n" + LINEAR + INPUTS, [], "failed to import: it called sys.exit(3)"),
    (HEAD + "def make_model():\n    sys.exit()\n" + INPUTS, [], "make_model() called sys.exit(None)"),
    (HEAD + "class Stop(BaseException):\n    pass\ndef make_model():\n    raise Stop('halt')\n" + INPUTS, [],
     "make_model() raised Stop: halt"),
    (HEAD + "def make_model():\n    while True:\n        pass\n" + INPUTS, ["--timeout", "1"],
     "ran longer than --timeout 1 s"),
    (HEAD + LINEAR + "def make_inputs(batch, seed=0):\n    time.sleep(60)\n", ["--timeout", "0.5"],
     "ran longer than --timeout 0.5 s"),
    (HEAD.replace('"options": {}', '"options": {"buckets": "exp:0"}') + LINEAR + INPUTS, [], "numbers must be"),
    (HEAD.replace('"options": {}', '"options": {"buckets": "sometimes"}') + LINEAR + INPUTS, [], "does not parse"),
    (HEAD.replace('"options": {}', '"options": {"buckets": {"batch": "exp"}}') + LINEAR + INPUTS, [],
     "'batch' is not a shape symbol"),
], ids=["exit-at-import", "exit-in-make_model", "BaseException", "hang-in-make_model", "sleep-in-make_inputs",
        "buckets-zero", "buckets-garbage", "buckets-not-a-symbol"])
@pytest.mark.parametrize("command", ["warm", "package"])
def test_a_hostile_model_file_is_one_line(tmp_path, text, args, expected, command):
    path = tiny_model(tmp_path, "hostile", text)
    where = ["-d", tmp_path / "c"] if command == "warm" else ["-o", tmp_path / "out.hpkg"]
    start = time.perf_counter()
    line = one_line(cli(command, path, *where, *args, code=1))
    assert line.startswith("error:") and expected in line, line
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "out.hpkg").exists()


def test_analyze_reports_an_error_in_forward_as_the_models(tmp_path):
    text = HEAD + "class M(torch.nn.Module):\n    def forward(self, x):\n        raise KeyError('no such layer')\n" \
        "def make_model():\n    return M()\n" + INPUTS
    for command in ("analyze", "coverage"):
        extra = ["-d", tmp_path / "c"] if command == "coverage" else []
        line = one_line(cli(command, tiny_model(tmp_path, "fwd", text), *extra, code=1))
        assert "the model at batch=2 raised KeyError" in line and "unexpected" not in line, line


def test_a_huge_power_in_a_stored_program_guard_fails_fast(tmp_path):
    """The same bounded evaluator serves the cache's program guards: a pow guard ends at once (it is a
    miss once stored entries that fail are quarantined; until then one error naming the bound)."""
    from test_programs import _compile_and_run, _keys, _rewrite

    cache_dir, x = tmp_path / "c", torch.randn(5, 8)
    _compile_and_run(cache_dir, x)
    (key,) = _keys(cache_dir, programs=True)
    _rewrite(cache_dir, key, lambda raw: raw["guards"].append(["eq", ["pow", 2, ["pow", 10, 18]], 0]))
    start = time.perf_counter()
    try:
        got, want = _compile_and_run(cache_dir, x)
        torch.testing.assert_close(got, want)
    except Exception as e:  # Dynamo wraps what the backend raised
        assert "more than 4096 bits" in str(e), e
    assert time.perf_counter() - start < 30


def test_a_pow_node_run_by_the_executor_fails_fast(built):
    """What a cached recipe runs: the executor's operator::pow is bounded too (no ``**`` in generated code).
    On literals it is refused at load; on a size only the call knows, when it runs."""
    from hpu_backend.formats.recipe import Recipe
    from hpu_backend.runtime import RecipeLoadError, build_callable

    raw = copy.deepcopy(recipe(built[1]))
    raw["nodes"].insert(0, node("big", "operator::pow", [2, 10 ** 18], [], kind="sym", expr=0))
    raw["outputs"].append({"r": "big"})
    with pytest.raises(RecipeLoadError, match="more than 4096 bits"):
        build_callable(Recipe.from_plain(raw))
    user = raw["input_names"][-1]
    raw["nodes"][0] = node("n", "aten::sym_size.int", [{"r": user}, 0], [], kind="sym", expr=0)
    raw["nodes"].insert(1, node("big", "operator::pow", [{"r": "n"}, 10 ** 18], [], kind="sym", expr=0))
    bad = Recipe.from_plain(raw)
    run = build_callable(bad)
    assert "**" not in run.source
    args = [torch.zeros([d if isinstance(d, int) else 2 for d in spec.shape]) for spec in bad.inputs]
    start = time.perf_counter()
    with pytest.raises(OverflowError, match="more than 4096 bits"):
        run(args)
    assert time.perf_counter() - start < 5


# -- round 4: shared subtrees, record fields ------------------------------------------------------------------------

def _squares(depth: int, leaf="s0"):
    """``t = ["mul", t, t]`` ``depth`` times: a tree of 2**(depth+1) - 1 nodes that shares every subtree in
    memory (and is written out in full by msgpack)."""
    tree = leaf
    for _ in range(depth):
        tree = ["mul", tree, tree]
    return tree


def _chain(depth: int):
    tree = "s0"
    for _ in range(depth):
        tree = ["mul", "s0", tree]
    return tree


def test_a_tree_of_nested_multiplications_24_deep_is_refused_without_walking_it():
    """2**25 nodes: walked, it took 20 s to validate and a minute to evaluate; refused after 4,096 steps."""
    with pytest.raises(symexpr.SymExprError, match="more than 4096 nodes"):
        symexpr.validate(["eq", _squares(24), 1])
    with pytest.raises(symexpr.SymExprError, match="operands"):
        symexpr.validate(["add", *[1] * 100_000])
    with pytest.raises(symexpr.SymExprError, match="levels"):
        symexpr.validate(_chain(100))
    assert symexpr.validate(_chain(24)) == 49 and symexpr.evaluate(_chain(24), {"s0": 2}) == 2 ** 25


def test_a_package_guard_of_nested_multiplications_is_refused_by_load_and_verify(built, tmp_path):
    path = crafted(built, tmp_path, lambda raw: recipe(raw)["guards"].append(["eq", _squares(13), 1]))
    assert "more than 4096 nodes" in refused(path)


def test_a_guard_of_nested_multiplications_24_deep_in_a_chain_is_served(built, tmp_path):
    """The same depth as a chain (49 nodes) is a guard like any other: it holds, and the package serves."""
    path = crafted(built, tmp_path, lambda raw: recipe(raw)["guards"].append(["ge", _chain(24), 1]))
    x = built[2].inputs({"batch": 8})[0]
    with torch.no_grad():
        torch.testing.assert_close(load_package(path)(x), built[2].build_model().eval()(x))
    assert "recipes load" in cli("verify", path).output


def test_a_recipe_whose_trees_are_too_many_in_all_is_refused(built, monkeypatch):
    from hpu_backend.formats import recipe as recipe_format

    raw = copy.deepcopy(recipe(built[1]))
    raw["guards"] += [["ge", _squares(8), 0]] * 3  # 511 nodes each, within the bound of one tree
    recipe_format.Recipe.from_plain(copy.deepcopy(raw))
    monkeypatch.setattr(recipe_format, "MAX_TREE_NODES", 1000)
    with pytest.raises(recipe_format.RecipeFormatError, match="more than 1,000 nodes in all"):
        recipe_format.Recipe.from_plain(raw)


@pytest.mark.parametrize("field", ["__class__", "keys", "items", "__dict__", "not a name"])
def test_a_record_layout_whose_field_is_not_a_field_name_is_refused(built, tmp_path, field):
    path = crafted(built, tmp_path, lambda raw: raw.update(out_spec=["record", [field], [None]]))
    assert "record field" in refused(path)


def test_a_record_layout_with_field_names_is_served_as_a_record(built, tmp_path):
    path = crafted(built, tmp_path, lambda raw: raw.update(out_spec=["record", ["logits"], [None]]))
    x = built[2].inputs({"batch": 8})[0]
    with torch.no_grad():
        out = load_package(path)(x)
        torch.testing.assert_close(out.logits, built[2].build_model().eval()(x))
    assert list(out.keys()) == ["logits"] and out["logits"] is out.logits


def test_a_tree_too_large_is_refused_while_it_is_read_and_flat_lists_are_not_counted():
    """Written out, ``_squares(24)`` is a 134 MB file that took gigabytes and minutes to read before it could be
    refused; the reader counts each nested expression as its lists arrive and stops after 4,096 nodes."""
    from hpu_backend.formats.recipe import RecipeFormatError, unpack

    with pytest.raises(RecipeFormatError, match="more than 4096 nodes; no guard"):
        unpack(msgpack.packb({"guards": [["eq", _squares(16), 1]]}))
    names = ["add", *[f"add_{i}" for i in range(10_000)]]  # a list of node names that starts like an expression
    deep = _chain(60)
    doc = unpack(msgpack.packb({"names": names, "guards": [deep, _squares(11)]}))
    assert doc["names"] == names and doc["guards"] == [deep, _squares(11)]
