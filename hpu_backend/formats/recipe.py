"""The Recipe: what lowering produces and the runtime executes — plain data, msgpack on disk.

A recipe holds no code and no pickled objects. Ops are names (``aten::add.Tensor``) that the
runtime resolves through its allowlist; arguments are tagged plain values (``{"r": name}`` for a
reference to another value, ``{"dtype": "float32"}`` ...); sizes that depend on shape symbols are
``symexpr`` trees. ``Recipe.from_bytes`` checks the whole structure against the dataclass
annotations below before anything else looks at it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import msgpack

from . import symexpr
from ..errors import HpuBackendError

FORMAT_VERSION = 2  # 2: recipes declare the inputs they write (``writes``)

KINDS = ("forward", "backward", "inference", "lazy")  # lazy: a lazy-mode graph (capture/lazy.py)


class RecipeFormatError(HpuBackendError, ValueError):
    """Bytes that are not a recipe of this format version (raised by ``Recipe.from_bytes``)."""


@dataclass
class ValueSpec:
    """Metadata of one value: a tensor (dtype, shape, stride), a SymInt, or a plain scalar."""

    kind: str  # "tensor" | "sym" | "scalar" | "none" | "other"
    dtype: str = ""
    shape: list[Any] = field(default_factory=list)  # symexpr trees
    stride: list[Any] = field(default_factory=list)
    expr: Any = None  # for kind == "sym": the symexpr tree of its value
    # Set by lowering passes (placement / memory planning):
    device: str = ""


@dataclass
class Node:
    """One op of the schedule, in execution order."""

    name: str
    op: str  # "aten::add.Tensor", "operator::getitem", ...
    args: list[Any]
    kwargs: dict[str, Any]
    out: list[ValueSpec]  # one spec per output (a single-output op has one)
    placement: str = "hpu"  # "hpu" | "cpu"
    engine: str = ""  # "mme" | "tpc" | "dma" | "host" | ""
    cluster: int = -1
    fusion: int = -1
    source: str = ""  # the user's source line, for diagnostics


@dataclass
class Constant:
    """A tensor constant lifted from the graph (small; weights are inputs, never constants)."""

    dtype: str
    shape: list[int]
    data: bytes


@dataclass
class Recipe:
    """One lowered graph for one shape bucket."""

    name: str  # e.g. "fx_graph_0003_fw"
    kind: str  # one of KINDS
    target: str  # "gaudi2" | "gaudi3"
    inputs: list[ValueSpec]
    input_names: list[str]
    nodes: list[Node]
    outputs: list[Any]  # tagged args: {"r": name} or constants
    symbols: list[str] = field(default_factory=list)  # normalized: s0, s1, ...
    # For each symbol, where its value is read at run time: [input index, dim] (dim -1: a SymInt input)
    symbol_sources: list[list[int]] = field(default_factory=list)
    guards: list[Any] = field(default_factory=list)  # symexpr trees that must hold
    bucket: dict[str, list[int]] = field(default_factory=dict)  # symbol -> [lo, hi]
    constants: dict[str, Constant] = field(default_factory=dict)
    # Facts from lowering passes: placement, clusters, fusions, memory plan, cost. Plain maps.
    facts: dict[str, Any] = field(default_factory=dict)
    # The inputs (by name) its ops write into: AOTAutograd's mutated inputs, lazy mode's write-backs. The
    # runtime refuses a recipe whose ops write anything else (runtime/writes.py).
    writes: list[str] = field(default_factory=list)
    version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Recipe":
        return cls.from_plain(unpack(data))

    @classmethod
    def from_plain(cls, raw: Any, where: str = "recipe") -> "Recipe":
        """A recipe from unpacked msgpack data, checked against the schema; RecipeFormatError if off."""
        return versioned(cls, raw, "version", FORMAT_VERSION, where, "recipe")

    def check(self, where: str = "recipe") -> None:
        """Version and cross-field checks (references resolve, trees are well-formed)."""
        if self.version != FORMAT_VERSION:
            raise RecipeFormatError(f"{where}: recipe format version {self.version!r}, expected {FORMAT_VERSION}")
        _check_semantics(self, where)

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}


def versioned(cls: type, raw: Any, field: str, version: int, where: str, what: str) -> Any:
    """``cls`` built from unpacked data whose ``field`` must equal ``version``, then checked; else RecipeFormatError."""
    if not isinstance(raw, dict) or raw.get(field) != version:
        got = raw.get(field) if isinstance(raw, dict) else type(raw).__name__
        raise RecipeFormatError(f"{where}: {what} format version {got!r}, expected {version}")
    return checked(lambda: build(cls, raw, where), where)


def checked(make: Callable[[], Any], where: str) -> Any:
    """``make()`` followed by its ``check(where)``; any failure in either is a RecipeFormatError.

    Stored data may be malformed in ways the schema cannot see (a list where a name belongs), and
    whatever that raises must still reach the caller as "not a usable recipe".
    """
    try:
        value = make()
        value.check(where)
        return value
    except RecipeFormatError:
        raise
    except Exception as e:  # malformed content can fail anywhere; all of it means "not usable"
        raise RecipeFormatError(f"{where}: {type(e).__name__}: {e}") from None


def unpack(data: bytes) -> Any:
    """msgpack bytes → plain data (maps with string keys); RecipeFormatError for anything else, and for a nested
    expression tree of more than ``symexpr.MAX_NODES`` nodes, refused while it is read (``_tree_sizes``)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, list_hook=_tree_sizes())
    except _TreeTooLarge as e:
        raise RecipeFormatError(str(e)) from None
    except Exception as e:  # msgpack raises many types for bad input
        raise RecipeFormatError(f"not a msgpack document: {e}") from None


class _TreeTooLarge(Exception):
    pass


def _tree_sizes() -> Callable[[list], list]:
    """msgpack's list hook: the size of every nested expression tree (``[op, ...]`` with an op of symexpr.OPS),
    counted bottom-up as its lists are read. Its bytes are a few per node, but the objects they become are tens
    of bytes each, so a tree of 2**24 nodes (a 134 MB file) would take gigabytes and minutes to read before
    ``symexpr.validate`` could refuse it; it is refused here after MAX_NODES nodes. A flat list (no nested
    expression) is not counted: what it costs is what its bytes say. A closure, called for every list read:
    the common case (not an expression) is one test."""
    sizes: dict[int, int] = {}  # id of an expression list read and not yet taken by a parent -> its nodes

    def hook(items: list, ops=symexpr.OPS, str_=str, list_=list) -> list:
        if not items or type(items[0]) is not str_ or items[0] not in ops:
            return items
        nested = [sizes.pop(id(c)) for c in items[1:] if type(c) is list_ and id(c) in sizes]
        size = len(items) - len(nested) + sum(nested)
        if nested and size > symexpr.MAX_NODES:
            raise _TreeTooLarge(f"an expression tree of more than {symexpr.MAX_NODES} nodes; no guard, size or "
                                "stride is that large")
        sizes[id(items)] = size
        return items

    return hook


def build(tp: Any, value: Any, where: str) -> Any:
    """Check ``value`` against annotation ``tp`` and construct dataclasses; RecipeFormatError if off."""
    return _converter(tp)(value, where)


@functools.cache
def _converter(tp: Any):
    """A function (value, where) -> checked value for annotation ``tp``, built once per type."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)
    if tp is Any:
        return lambda v, where: v
    if origin in (Union, types.UnionType):
        options = [_converter(t) for t in typing.get_args(tp)]
        return functools.partial(_first_match, options, tp)
    if origin in (list, dict):
        item = _converter(typing.get_args(tp)[-1])
        return functools.partial(_list if origin is list else _map, item)
    if tp is type(None):
        return functools.partial(_scalar, (type(None),))
    return functools.partial(_scalar, (tp,))


def _dataclass_converter(tp: type):
    hints = typing.get_type_hints(tp)
    fields = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(tp)}

    def convert(value: Any, where: str):
        if not isinstance(value, dict):
            raise RecipeFormatError(f"{where}: expected a map, got {type(value).__name__}")
        unknown = set(value) - set(fields)
        if unknown:
            raise RecipeFormatError(f"{where}: unknown fields {sorted(unknown)}")
        try:
            return tp(**{k: fields[k](v, f"{where}.{k}") for k, v in value.items()})
        except TypeError as e:
            raise RecipeFormatError(f"{where}: {e}") from None

    return convert


def _first_match(options, tp, value, where):
    for option in options:
        try:
            return option(value, where)
        except RecipeFormatError:
            continue
    raise RecipeFormatError(f"{where}: {value!r:.60} does not match {tp}")


def _list(item, value, where):
    if not isinstance(value, list):
        raise RecipeFormatError(f"{where}: expected a list, got {type(value).__name__}")
    return [item(v, where) for v in value]


def _map(item, value, where):
    if not isinstance(value, dict):
        raise RecipeFormatError(f"{where}: expected a map, got {type(value).__name__}")
    return {k: item(v, where) for k, v in value.items()}


def _scalar(types_, value, where):
    if type(value) in types_:  # exact: a bool is not an int here, an int is not a float
        return value
    raise RecipeFormatError(f"{where}: expected {types_[0].__name__}, got {type(value).__name__}")


def _check_semantics(recipe: Recipe, where: str = "recipe") -> None:
    """Cross-field checks: kinds, references resolve, symbol sources exist, trees are well-formed."""
    def bad(message: str) -> RecipeFormatError:
        return RecipeFormatError(f"{where}: {message}")

    if recipe.kind not in KINDS:
        raise bad(f"kind {recipe.kind!r} is not one of {KINDS}")
    if len(recipe.inputs) != len(recipe.input_names):
        raise bad("inputs and input_names differ in length")
    if len(recipe.symbol_sources) != len(recipe.symbols):
        raise bad("symbols and symbol_sources differ in length")
    for symbol, lo_hi in recipe.bucket.items():  # [lo, hi]: show and the dispatcher read both ends
        if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
            raise bad(f"bucket of {symbol!r:.40} is not a [lo, hi] range: {lo_hi!r:.40}")
        if symbol not in recipe.symbols:
            raise bad(f"bucket on {symbol!r:.40}, which is not one of the recipe's symbols")
    for source in recipe.symbol_sources:
        if not _readable(source, recipe.inputs):
            raise bad(f"symbol source {source!r:.40} names no input dimension")
    if set(recipe.writes) - set(recipe.input_names):
        raise bad(f"writes {sorted(set(recipe.writes) - set(recipe.input_names))!r:.60}, which are not inputs")
    known = set(recipe.input_names) | set(recipe.constants)
    for node in recipe.nodes:
        for ref in iter_refs([node.args, list(node.kwargs.values())]):
            if ref not in known:
                raise bad(f"node {node.name!r:.40} uses {ref!r:.40} before it is defined")
        if node.name in known:
            raise bad(f"value name {node.name!r:.40} defined twice")
        known.add(node.name)
    for ref in iter_refs(recipe.outputs):
        if ref not in known:
            raise bad(f"output refers to unknown value {ref!r:.40}")
    try:
        _check_trees(recipe)
    except symexpr.SymExprError as e:
        raise bad(str(e)) from None
    _FACTS(recipe.facts, f"{where}: facts")


MAX_TREE_NODES = 1 << 20  # all of a recipe's symbolic trees together: the work a load may spend evaluating them


def _check_trees(recipe: Recipe) -> None:
    """Every guard, size, stride and symbolic value is a well-formed tree, each bounded (symexpr.validate) and all
    of them together at most MAX_TREE_NODES nodes: the load evaluates them at each bucket's ends."""
    specs = [*recipe.inputs, *(s for node in recipe.nodes for s in node.out)]  # show prints them all
    trees = [*recipe.guards, *(t for spec in specs for t in spec.shape + spec.stride),
             *(spec.expr for spec in specs if spec.expr is not None)]
    total = 0
    for tree in trees:
        total += symexpr.validate(tree)
        if total > MAX_TREE_NODES:
            raise symexpr.SymExprError(f"its symbolic trees hold more than {MAX_TREE_NODES:,} nodes in all")


# What readers of ``Recipe.facts`` rely on (fallback reports, analysis, ``hpurecipe show``), checked
# on load so that a malformed stored fact is a miss, not a failure on every later run. Extra keys are
# allowed; a known key must have its shape. A field check is a type, a tuple of types, or a function.
_NUM = (int, float)


def _list_of(check):
    def run(value, where):
        _expect(value, list, where)
        for i, item in enumerate(value):
            _check_value(item, check, f"{where}[{i}]")
    return run


def _map_of(check):
    def run(value, where):
        _expect(value, dict, where)
        for k, v in value.items():
            _check_value(v, check, f"{where}.{k}")
    return run


def _record(**fields):
    """A map whose listed keys, where present, pass their checks; a key ending in "!" is required."""
    def run(value, where):
        _expect(value, dict, where)
        for name, check in fields.items():
            key = name.rstrip("!")
            if key in value:
                _check_value(value[key], check, f"{where}.{key}")
            elif name.endswith("!"):
                raise RecipeFormatError(f"{where}: missing {key!r}")
    return run


def _expect(value, types_, where):
    if not isinstance(value, types_) or (isinstance(value, bool) and bool not in _as_tuple(types_)):
        raise RecipeFormatError(f"{where}: expected {'/'.join(t.__name__ for t in _as_tuple(types_))}, "
                                f"got {type(value).__name__}")


def _as_tuple(types_):
    return types_ if isinstance(types_, tuple) else (types_,)


def _check_value(value, check, where):
    if isinstance(check, (type, tuple)):
        _expect(value, check, where)
    else:
        check(value, where)


_FACTS = _record(
    placement=_record(**{"fallbacks": _list_of(_record(**{"op!": str, "dtypes!": _list_of(str), "line!": str,
                                                           "reason": str})),
                         "engines": _map_of(int)}),
    clusters=_record(count=int, sizes=_list_of(int)),
    fusions=_list_of(_record(**{"kind!": str})),
    transfers=_list_of(dict),
    plan_at=_map_of(int),
    host_transfers=_record(count=int, bytes=_NUM, items=_list_of(dict)),
    memory=_record(peak_bytes=_NUM, arena_bytes=_NUM, persistent_bytes=_NUM, on_chip_bytes=_NUM, fits_hbm=bool,
                   buffers=_list_of(list)),
    cost=_record(device_s=_NUM, cpu_s=_NUM, transfer_s=_NUM, total_s=_NUM, clusters=_list_of(dict)),
    compile_time_s=_NUM,
    annotations=_map_of(dict),
    sdpa_calls=_list_of(str),
)


def _readable(source: list[int], inputs: list[ValueSpec]) -> bool:
    if len(source) != 2 or not 0 <= source[0] < len(inputs):
        return False
    spec, dim = inputs[source[0]], source[1]
    return spec.kind == "sym" if dim == -1 else (spec.kind == "tensor" and 0 <= dim < len(spec.shape))


def iter_refs(arg: Any):
    """Yield the value names an encoded argument refers to."""
    if isinstance(arg, dict):
        if "r" in arg and len(arg) == 1:
            yield arg["r"]
        else:
            for v in arg.values():
                yield from iter_refs(v)
    elif isinstance(arg, list):
        for v in arg:
            yield from iter_refs(v)

