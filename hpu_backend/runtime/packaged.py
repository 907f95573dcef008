"""Serve a recipe package: load it (weights bound into the executors once), then per call flatten the
arguments, pick the bucket, run its recipe.

Nothing here imports Dynamo or AOTAutograd: the package's recipes go through the same checked loader
as the cache's, the call layout is a plain tree turned into a pytree spec of tuples, lists and dicts
(never a type named by the file), and bucket selection is a dict lookup on the symbol values read
from the inputs (a new tuple of values is checked against the package's ranges, buckets and guards once).

Before anything is bound, ``check_package`` checks what the file cannot be trusted to say: no op writes
into an input (parameters are bound by reference, so a write would change the caller's model), and at
each bucket's smallest and largest sizes nothing it declares or asks its ops to make is larger than its
own memory plan's peak (``hpurecipe verify`` also runs each bucket there on meta tensors).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..errors import one_line
from ..formats import symexpr
from ..formats.package import Package, PackageError, check_toolchain, read_package, record_field
from ..formats.recipe import Constant, Recipe, ValueSpec
from . import ops
from .executor import (RecipeLoadError, build_callable, check_constant, check_ops, dtype_from_name,
                       load_constant)
from .metacheck import meta_run
from .symbolic import SymbolicError, symbolic_values
from .symbols import symbol_reader
from .writes import writes_anything


def load_package(path: str | os.PathLike, model: torch.nn.Module | None = None) -> "PackagedModel":
    """A callable that serves the package's buckets with ``model``'s current weights.

    Without ``model``, the weights stored in the package (``--with-weights``) are used. A package
    built by another toolchain is refused, naming both; so is one that is not signed with
    ``HPURECIPE_BUNDLE_KEY`` when that is set. A call outside the packaged buckets raises PackageError
    naming the input and the covered range.
    """
    package = read_package(path)
    check_toolchain(package, path)
    check_package(package, path)
    fixed = _fixed_inputs(package, model, path)
    try:  # every bucket's ops and constants checked now; its executor is built when a call first selects it
        for recipe in package.recipes:
            check_ops(recipe)
            for constant in recipe.constants.values():
                check_constant(constant)
    except RecipeLoadError as e:
        raise PackageError(f"{path}: a recipe cannot be loaded ({e})") from None
    # weights and constants bound into each executor once; a call passes only the user's inputs
    binds = [{name: t for name, t in zip(r.input_names, fixed) if t is not None} for r in package.recipes]
    return PackagedModel(package, binds, str(path))


# -- what a package may do: checked before anything is bound ----------------------------------------------

def check_package(package: Package, path: str | os.PathLike, run_on_meta: bool = False) -> None:
    """PackageError (one line) unless every bucket writes into no input and, at its smallest and largest sizes,
    evaluates its guards and stays within its memory plan: no value it declares, and no size, repeat count,
    padding or range its ops are given (literals and the symbolic arithmetic that computes them), exceeds
    the plan's peak.

    With ``run_on_meta`` (``hpurecipe verify``), each bucket also runs on meta tensors at those sizes, so
    that what the ops compute is checked too, not only what the file declares; it imports Dynamo (torch's
    meta kernels do), which is why a serving process's ``load_package`` does not do it.
    """
    for recipe in package.recipes:
        where = f"{path}: bucket {_label(recipe.bucket)}"
        _check_writes(recipe, where)
        sized, declared = _sized_args(recipe, where), _declared(recipe)
        for env in _corners(recipe, package.ranges, where):
            _check_guards(recipe, env, where)
            _check_plan(recipe, sized, declared, env, where)
            if run_on_meta:
                _check_sizes(recipe, env, where)


def _label(bucket: dict[str, list[int]]) -> str:
    return " ".join(f"{s}={lo}-{hi}" for s, (lo, hi) in bucket.items()) or "(static)"


@functools.cache
def _op_facts(name: str) -> tuple[bool, bool, tuple[str, ...] | None]:
    """Whether an allowlisted op writes an argument, whether it returns a view, and its argument names
    (None for symbolic arithmetic); OpNotAllowed for any other name."""
    schema = getattr(ops.resolve(name), "_schema", None)
    if schema is None:
        return False, False, None
    return (schema.is_mutable, any(r.alias_info is not None for r in schema.returns),
            tuple(a.name for a in schema.arguments))


def _check_writes(recipe: Recipe, where: str) -> None:
    """No op of the recipe writes into an argument (``copy_`` into a bound weight, an ``out=``, batch norm's
    running statistics in training mode), also through ``with_effects`` (the one op that calls an op it is
    given), and the recipe declares no write: what an op writes is what it does (``runtime.writes``), not
    only what its schema marks."""
    if recipe.writes:
        raise PackageError(f"{where}: declares writes into {recipe.writes!r:.60}; a package never changes the "
                           "caller's tensors")
    for node in recipe.nodes:
        called = [node.op, *(_op_args(node.args) if node.op == "higher_order::with_effects" else ())]
        for name in called:
            try:
                _op_facts(name)
            except ops.OpNotAllowed as e:
                raise PackageError(f"{where}: node {node.name!r:.40}: {e}") from None
        if writes_anything(node):
            raise PackageError(f"{where}: node {node.name!r:.40} ({node.op}) writes into one of its inputs; "
                               "a package never changes the caller's tensors")


def _op_args(args: Any):
    """The op names passed as arguments (``{"op": name}``)."""
    if isinstance(args, dict):
        if set(args) == {"op"}:
            yield args["op"]
        else:
            for v in args.values():
                yield from _op_args(v)
    elif isinstance(args, list):
        for v in args:
            yield from _op_args(v)


def _corners(recipe: Recipe, ranges: dict[str, list[int]], where: str) -> list[dict[str, int]]:
    """The bucket's smallest and largest symbol values within the package's ranges."""
    bounds = {s: (max(recipe.bucket.get(s, ranges[s])[0], ranges[s][0]),
                  min(recipe.bucket.get(s, ranges[s])[1], ranges[s][1])) for s in recipe.symbols}
    if any(lo > hi for lo, hi in bounds.values()):
        raise PackageError(f"{where}: lies outside the package's ranges {ranges}")
    return [{s: b[end] for s, b in bounds.items()} for end in (0, 1)]


# Arguments that say how many elements an op makes (compared with the plan's peak, in bytes: an element
# takes at least one); arange's ends only for ops named arange (slice's "end" is often INT64_MAX).
SIZE_ARGS = frozenset({"size", "sizes", "shape", "repeats", "pad", "output_size", "steps", "n", "m"})
RANGE_ARGS = frozenset({"start", "end"})


def _sized_args(recipe: Recipe, where: str) -> list[tuple[str, str, Any]]:
    """(node name, argument name, value) of every argument that says how many elements an op makes;
    PackageError for a node passing more arguments than its op takes."""
    sized = []
    for node in recipe.nodes:
        names = _op_facts(node.op)[2]
        if names is None:
            continue
        if len(node.args) > len(names) or set(node.kwargs) - set(names):
            raise PackageError(f"{where}: node {node.name!r:.40} passes arguments {node.op} does not take")
        for name, value in [*zip(names, node.args), *node.kwargs.items()]:
            if value is not None and (name in SIZE_ARGS or (name in RANGE_ARGS and "arange" in node.op)):
                sized.append((node.name, name, value))
    return sized


def _declared(recipe: Recipe) -> list[tuple[str, list, int]]:
    """(node name, shape, element size) of every tensor a node that is not a view declares it makes."""
    return [(node.name, spec.shape, dtype_from_name(spec.dtype).itemsize) for node in recipe.nodes
            if not _op_facts(node.op)[1] for spec in node.out if spec.kind == "tensor"]


def _check_plan(recipe: Recipe, sized: list, declared: list, env: dict[str, int], where: str) -> None:
    """Declared values and the sizes ops are given, at ``env``, within the recipe's memory plan."""
    peak = recipe.facts.get("memory", {}).get("peak_bytes")
    if not isinstance(peak, (int, float)):
        raise PackageError(f"{where}: the recipe has no memory plan to bound its allocations")
    for node, shape, itemsize in declared:
        if math.prod(abs(int(_evaluate(d, env, where))) for d in shape) * itemsize > peak:
            raise PackageError(f"{where}: node {node!r:.40} declares a value larger than the recipe's "
                               f"memory plan ({peak} bytes peak) at {env}")
    ints = _int_values(recipe, env, where)
    for node, name, value in sized:
        count = _count(value, ints)
        if count is None or count > peak:
            raise PackageError(f"{where}: node {node!r:.40} is given {name}={value!r:.60} at {env}: "
                               f"not a size within the recipe's memory plan ({peak} bytes peak)")


def _count(value: Any, ints: dict[str, int]) -> int | None:
    """How many elements a size argument asks for (a product for a list); None if it is not one."""
    items = value if isinstance(value, list) else [value]
    n = 1
    for item in items:
        item = ints.get(item["r"]) if isinstance(item, dict) and set(item) == {"r"} else item
        if type(item) not in (int, float):
            return None
        n *= max(abs(item), 1) if isinstance(value, list) else abs(item)
    return n


def _int_values(recipe: Recipe, env: dict[str, int], where: str) -> dict[str, Any]:
    """The values of the recipe's symbolic arithmetic at ``env``, computed by the runtime's bounded ops, not as
    declared: a bound broken or an index out of range is refused here, at load, not at the first call."""
    try:
        return symbolic_values(recipe, env)
    except SymbolicError as e:
        raise PackageError(f"{where}: at {env}: {e}") from None


def _evaluate(tree: Any, env: dict[str, int], where: str) -> Any:
    try:
        return symexpr.evaluate(tree, env)
    except symexpr.SymExprError as e:
        raise PackageError(f"{where}: {e}") from None


def _check_guards(recipe: Recipe, env: dict[str, int], where: str) -> None:
    for guard in recipe.guards:
        try:
            symexpr.evaluate(guard, env)
        except symexpr.SymExprError as e:
            raise PackageError(f"{where}: guard {symexpr.to_str(guard)[:60]}: {e}") from None


def _check_sizes(recipe: Recipe, env: dict[str, int], where: str) -> None:
    """Run the recipe on meta tensors at ``env``: no value an op computes may exceed the recipe's memory plan.

    Sizes are what the ops compute, not what the node specs declare (a crafted spec may understate them;
    a meta kernel may also shape an unused output differently from the host kernel, e.g. batch norm's
    saved statistics, so specs are not compared).
    """
    try:
        values = _meta_run(recipe, env)
    except PackageError:
        raise
    except Exception as e:  # any op or argument may fail on crafted data; all of it means "not usable"
        raise PackageError(f"{where}: cannot be run at {env}: {one_line(e, 160)}") from None
    peak = recipe.facts.get("memory", {}).get("peak_bytes")
    for node, value in zip(recipe.nodes, values):
        if _is_view(node.op):
            continue
        for v in value if isinstance(value, (tuple, list)) else [value]:
            size = v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
            if size and (peak is None or size > peak):
                raise PackageError(f"{where}: node {node.name!r:.40} allocates {size} bytes at {env}, more than "
                                   f"the recipe's memory plan ({peak} bytes peak)")


def _is_view(name: str) -> bool:
    return _op_facts(name)[1]


def _meta_run(recipe: Recipe, env: dict[str, int]) -> list:
    return meta_run(recipe, [_meta_input(spec, env) for spec in recipe.inputs])


def _meta_input(spec: ValueSpec, env: dict[str, int]) -> Any:
    if spec.kind == "tensor":
        shape = [symexpr.evaluate(d, env) for d in spec.shape]
        stride = [symexpr.evaluate(d, env) for d in spec.stride]
        dtype = dtype_from_name(spec.dtype)
        if len(stride) != len(shape):  # no stride recorded: contiguous
            return torch.empty(shape, dtype=dtype, device="meta")
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if spec.kind in ("sym", "scalar") and spec.expr is not None:
        return symexpr.evaluate(spec.expr, env)
    if spec.kind == "none":
        return None
    raise PackageError(f"an input of kind {spec.kind!r:.20} cannot be checked")


# -- call layouts: our plain trees <-> pytree specs of tuples, lists and dicts ------------------------------

class Record(dict):
    """A result that the model returned as a mapping of named fields (a Hugging Face ``ModelOutput``): a dict
    whose keys also read as attributes (``out.logits``, ``out["logits"]``). Our own type: a package never names
    the model's class."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


pytree.register_pytree_node(Record, lambda r: (list(r.values()), list(r.keys())),
                            lambda values, keys: Record(zip(keys, values)),
                            serialized_type_name="hpu_backend.runtime.packaged.Record")

_KINDS = {"tuple": tuple, "list": list, "dict": dict, "record": Record}


def layout_of(spec: pytree.TreeSpec, what: str) -> Any:
    """A call layout as a plain tree; PackageError if it holds anything but tuples, lists, dicts with
    string keys, mappings of named fields (records), and leaves."""
    if spec.is_leaf():
        return None
    kind = next((k for k, t in _KINDS.items() if spec.type is t), None) or (
        "record" if _named_fields(spec) else None)
    if kind is None or (kind == "dict" and not all(isinstance(k, str) for k in spec.context)):
        name = getattr(spec.type, "__qualname__", str(spec.type))
        raise PackageError(f"the model's {what} holds a {name}; packages store tuples, lists, dicts with "
                           "string keys and mappings of named fields only")
    children = [layout_of(c, what) for c in spec.children()]
    return [kind, list(spec.context), children] if kind in ("dict", "record") else [kind, children]


def _named_fields(spec: pytree.TreeSpec) -> bool:
    """A mapping class of named fields (``ModelOutput``): its pytree context is its field names, one a child."""
    context = spec.context
    return (isinstance(context, (list, tuple)) and len(context) == spec.num_children
            and all(isinstance(k, str) and record_field(k) for k in context) and issubclass(spec.type, dict))


def treespec_of(layout: Any) -> pytree.TreeSpec:
    """The pytree spec of a checked layout, built from our own containers (nothing is imported)."""
    return pytree.tree_structure(_sample(layout))


def _sample(layout: Any) -> Any:
    if layout is None:
        return 0
    children = [_sample(c) for c in layout[-1]]
    if layout[0] in ("dict", "record"):
        return _KINDS[layout[0]](zip(layout[1], children))
    return _KINDS[layout[0]](children)


def _fixed_inputs(package: Package, model: torch.nn.Module | None, path) -> list[Any]:
    """The graph's inputs that do not come from the call: weights and constants, checked against specs."""
    state = {} if model is None else {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if model is None and not package.weights and any(
            gi.kind in ("parameter", "buffer") for gi in package.inputs):
        raise PackageError(f"{path}: pass the model (load_package(path, model)) or build the package "
                           "--with-weights")
    fixed: list[Any] = []
    for gi, spec in zip(package.inputs, package.recipes[0].inputs):
        if gi.kind == "user":
            fixed.append(None)
            continue
        if gi.kind == "constant":
            tensor = _load(package.constants, gi.target, path)
        elif model is not None:
            tensor = state.get(gi.target)
            if tensor is None:
                raise PackageError(f"{path}: the model has no {gi.kind} {gi.target!r}")
        else:
            tensor = _load(package.weights, gi.target, path)
        if list(tensor.shape) != spec.shape or str(tensor.dtype).removeprefix("torch.") != spec.dtype:
            raise PackageError(f"{path}: {gi.kind} {gi.target!r} is {str(tensor.dtype).removeprefix('torch.')}"
                               f"{list(tensor.shape)}, the package was built for {spec.dtype}{spec.shape}")
        fixed.append(tensor.detach())
    return fixed


def _load(table: dict[str, Constant], name: str, path) -> torch.Tensor:
    if name not in table:
        raise PackageError(f"{path}: the package holds no tensor {name!r}")
    try:
        return load_constant(table[name])
    except RecipeLoadError as e:
        raise PackageError(f"{path}: tensor {name!r}: {e}") from None


class PackagedModel:
    """Serves a package: flatten the call, check its shapes, run the bucket's recipe, unflatten."""

    def __init__(self, package: Package, binds: list[dict[str, torch.Tensor]], where: str = "package"):
        self.package = package
        self.where = where
        self.binds = binds  # per bucket, the inputs bound into its executor
        self.runs: list[Callable[[list], list] | None] = [None] * len(package.recipes)  # built on first use
        self.in_spec = treespec_of(package.in_spec)
        self.out_spec = treespec_of(package.out_spec)
        first = package.recipes[0]
        self.symbols = first.symbols
        user_slots = [slot for slot, gi in enumerate(package.inputs) if gi.kind == "user"]
        self.user = [package.inputs[slot].index for slot in user_slots]  # where each run input is in the call
        position = {slot: i for i, slot in enumerate(user_slots)}
        if any(slot not in position for slot, _ in first.symbol_sources):
            raise PackageError(f"{package.model}: a shape symbol is read from an input that is not the user's")
        self.read_symbols = symbol_reader([[position[slot], dim] for slot, dim in first.symbol_sources])
        self.names = {slot: gi.target for slot, gi in enumerate(package.inputs)}
        self.known: dict[tuple, Callable[[list], list]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            want, got = _layout(self.in_spec), _layout(spec)
            if want == got:
                want, got = (" ".join(str(s).split()) for s in (self.in_spec, spec))
            raise PackageError(f"the package takes {want}, got {got}")
        inputs = [flat[i] for i in self.user]
        if self.read_symbols is None:
            run = self.runs[0] or self._run(0)
        else:
            values = self.read_symbols(inputs)
            run = self.known.get(values) or self._select(values)
        with torch.no_grad():
            return pytree.tree_unflatten(run(inputs), self.out_spec)

    def _select(self, values: tuple) -> Callable[[list], list]:
        env = dict(zip(self.symbols, values))
        if not all(lo <= env[s] <= hi for s, (lo, hi) in self.package.ranges.items()):
            raise PackageError(self._outside(env))
        for i, recipe in enumerate(self.package.recipes):
            if all(lo <= env[s] <= hi for s, (lo, hi) in recipe.bucket.items()) and self._holds(recipe, env):
                run = self.known[values] = self.runs[i] or self._run(i)
                return run
        raise PackageError(self._outside(env))

    def _run(self, i: int) -> Callable[[list], list]:
        """Bucket ``i``'s executor, built (its ops were checked at load) the first time a call selects it."""
        recipe = self.package.recipes[i]
        try:
            self.runs[i] = build_callable(recipe, self.binds[i], checked=True)
        except RecipeLoadError as e:
            raise PackageError(f"{self.where}: bucket {_label(recipe.bucket)} cannot be loaded ({e})") from None
        return self.runs[i]

    def _holds(self, recipe: Recipe, env: dict[str, int]) -> bool:
        try:
            return all(symexpr.evaluate(g, env) for g in recipe.guards)
        except symexpr.SymExprError as e:
            raise PackageError(f"{self.package.model}: a guard of bucket {_label(recipe.bucket)} cannot be "
                               f"evaluated at {env}: {e}") from None

    def _outside(self, env: dict[str, int]) -> str:
        """Name the first input dimension no bucket covers, and what the package covers."""
        sources = dict(zip(self.symbols, self.package.recipes[0].symbol_sources))
        for sym in self.symbols:
            spans = sorted({tuple(r.bucket[sym]) for r in self.package.recipes})
            lo, hi = self.package.ranges[sym]
            if not any(a <= env[sym] <= b for a, b in spans) or not lo <= env[sym] <= hi:
                slot, dim = sources[sym]
                covered = ", ".join(f"{max(a, lo)}-{min(b, hi)}" for a, b in spans)
                return (f"input {self.names[slot]!r} dim {dim} = {env[sym]} is outside the packaged "
                        f"buckets ({covered}); warm and package that size too")
        return f"no packaged bucket covers the sizes {env}; warm and package them too"



def _layout(spec: pytree.TreeSpec) -> str:
    """A call's (args, kwargs) layout in words."""
    args, kwargs = spec.children()
    names = ", ".join(map(str, kwargs.context or []))
    return f"{args.num_children} positional argument(s)" + (f" and keyword(s) {names}" if names else "")
