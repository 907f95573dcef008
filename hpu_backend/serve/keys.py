"""Recipe keys: a hash over canonical parts, each hashed on its own so a miss can be explained.

Parts: ``graph`` (ops and arguments with normalized value names and host devices, kind,
constants' bytes, the annotations capture recorded),
``inputs`` (dtypes, symbolic shapes and strides by normalized symbol name), ``guards``,
``bucket``, ``settings`` (every field that changes a recipe) and ``toolchain`` (torch,
hpu_backend and recipe format versions). Weights are graph inputs, so their values are never in
a key. Everything is encoded with msgpack from sorted plain data: no ``id()``, addresses, set
order or ``hash()``, so keys are the same across processes and PYTHONHASHSEED values.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from ..formats.keyparts import PARTS, RECIPE_INPUT_FIELDS, toolchain
from ..formats.program import PROGRAM_VERSION
from ..formats.recipe import Recipe
from ..lowering.optable import shared_table
from ..settings import Settings
from ..errors import HpuBackendError


def _digest(obj: Any) -> str:
    return hashlib.blake2b(msgpack.packb(obj, use_bin_type=True), digest_size=16).hexdigest()


@dataclass(frozen=True)
class GraphKey:
    """The bucket-independent parts of a graph's keys, computed once per graph."""

    parts: dict[str, str]
    detail: dict[str, Any]

    def for_bucket(self, bucket: dict[str, list[int]]) -> tuple[str, dict[str, str], dict[str, Any]]:
        """(key, per-part hashes, readable details) for one bucket of this graph."""
        canon = [[s, list(r)] for s, r in sorted(bucket.items())]
        parts = dict(self.parts, bucket=_digest(canon))
        key = _digest([parts[p] for p in PARTS])[:32]
        return key, parts, dict(self.detail, bucket={s: list(r) for s, r in bucket.items()})


def graph_key(recipe: Recipe, settings: Settings) -> GraphKey:
    """Key parts of a captured (symbolic, pass-free) recipe under ``settings``."""
    names = {n: f"i{i}" for i, n in enumerate(recipe.input_names)}
    names.update({n: f"k{i}" for i, n in enumerate(sorted(recipe.constants))})
    names.update({node.name: f"n{i}" for i, node in enumerate(recipe.nodes)})
    graph = [
        recipe.kind,
        [[node.op, _norm(node.args, names), _norm(sorted(node.kwargs.items()), names),
          [_spec(s) for s in node.out]] for node in recipe.nodes],
        _norm(recipe.outputs, names),
        [[names[k], c.dtype, c.shape, hashlib.blake2b(c.data, digest_size=16).hexdigest()]
         for k, c in sorted(recipe.constants.items())],
    ]
    annotations = recipe.facts.get("annotations")
    if annotations:  # only when present, so that the keys of unannotated graphs stay as they were
        graph.append(sorted([names[k], _plain(v)] for k, v in annotations.items()))
    groups = recipe.facts.get("collectives")
    if groups:  # a collective's cost depends on its group's size (only present in graphs with collectives)
        graph.append(sorted([names[k], _plain(v)] for k, v in groups.items()))
    settings_part = settings_fields(settings, bool(recipe.symbols), {node.op for node in recipe.nodes})
    tc = dict(toolchain(), op_table=shared_table().digest)  # a change of the op table re-places the graph
    parts = {
        "graph": _digest(graph),
        "inputs": _digest([_spec(s) for s in recipe.inputs]),
        "guards": _digest(recipe.guards),
        "settings": _digest(_plain(settings_part)),
        "toolchain": _digest(sorted(tc.items())),
    }
    detail = {"settings": _plain(settings_part), "toolchain": tc,
              "inputs": [dict(zip(RECIPE_INPUT_FIELDS, _spec(s))) for s in recipe.inputs], "guards": recipe.guards}
    return GraphKey(parts, detail)


def settings_fields(settings: Settings, symbolic: bool, ops: set[str] | None = None) -> dict[str, Any]:
    """The settings part of a key: every field that changes a recipe, but the bucket policy for a graph without
    shape symbols (it has one shape, which no policy changes), and, given the graph's ``ops``, only the names
    of ``place_on_cpu`` that name one of them (the others place nothing of it). Both made misses for nothing."""
    from ..lowering.passes.place import placed_on_cpu_by

    fields = settings.key_fields()
    if not symbolic:
        fields.pop("buckets", None)
    if ops is not None and "place_on_cpu" in fields:
        fields["place_on_cpu"] = sorted(n for n in fields["place_on_cpu"] if any(placed_on_cpu_by(op, n) for op in ops))
    return fields


PROGRAM_PARTS = ("dynamo_graph", "inputs", "guards", "state", "settings", "toolchain")


class Unkeyable(HpuBackendError, TypeError):
    """A Dynamo graph holding something without a stable hash (its program is not cached)."""


@dataclass(frozen=True)
class ProgramKey:
    """The key of a Dynamo graph's program, and how its shape symbols are named and read."""

    key: str
    parts: dict[str, str]
    rename: dict[str, str]  # Dynamo symbol name -> s0, s1, ...
    sources: list[list[int]]  # per normalized symbol: [input index, dim] (-1: a SymInt input)
    detail: dict[str, Any] = field(default_factory=dict)  # readable parts, stored to explain a later miss


def program_key(gm: torch.fx.GraphModule, example_inputs: list, settings: Settings) -> ProgramKey:
    """Key of the program for a Dynamo graph, from the graph itself: no AOTAutograd trace.

    Parts: the graph (ops by qualified name, a custom op's registered backward and fake by their code, arguments
    with value names normalized, constants' bytes, annotations that change a recipe), the inputs (dtype, symbolic shape
    and stride, requires_grad, parameter or not,
    device type), Dynamo's guards on the shape symbols, global state AOTAutograd reads (grad
    mode, autocast per device, deterministic algorithms, AOTAutograd's configuration), settings and
    toolchain. Unkeyable when something has no stable form.
    """
    from ..lowering import LoweringError, recorded_annotations, symbol_table

    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        # AOTAutograd lifts these to graph inputs that Dynamo does not pass (an optimizer's state):
        # a program would need them bound, and keying them would hash every byte of them.
        raise Unkeyable("the graph holds parameters or buffers as attributes")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    if len(fakes) != len(example_inputs):
        raise Unkeyable("placeholders and example inputs differ in number")
    for real in example_inputs:
        if isinstance(real, torch.Tensor) and type(real) not in (torch.Tensor, torch.nn.Parameter):
            raise Unkeyable(f"input of type {type(real).__name__}")
    try:
        rename, sources = symbol_table(fakes)
    except LoweringError as e:
        raise Unkeyable(e.reason) from None
    names = {node: f"n{i}" for i, node in enumerate(gm.graph.nodes)}
    graph = [[n.op, _target(gm, n), _canon(n.args, names), _canon(dict(n.kwargs), names),
              *([_canon(a, names)] if (a := recorded_annotations(n)) else [])] for n in gm.graph.nodes]
    inputs = [_input(v, real, rename) for v, real in zip(fakes, example_inputs)]
    state, fields = _global_state(), _plain(settings_fields(settings, bool(rename)))
    tc = dict(toolchain(), program_format=PROGRAM_VERSION)
    parts = {"dynamo_graph": _digest(graph), "inputs": _digest(inputs), "guards": _digest(_dynamo_guards(rename)),
             "state": _digest(state), "settings": _digest(fields), "toolchain": _digest(sorted(tc.items()))}
    detail = {"inputs": inputs, "state": state, "settings": fields, "toolchain": tc}  # as keyed: compact
    return ProgramKey(_digest([parts[p] for p in PROGRAM_PARTS])[:32], parts, rename, sources, detail)


def _target(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    if node.op in ("placeholder", "output"):
        return None
    if node.op == "call_method":
        return node.target
    if node.op == "get_attr":
        value = getattr(gm, node.target, None)
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_meta:
            raise Unkeyable(f"get_attr {node.target!r} is not a dense tensor")
        t = value.detach().cpu().clone(memory_format=torch.contiguous_format)  # storage: exactly its data
        return [str(t.dtype), list(t.shape), hashlib.blake2b(bytes(t.untyped_storage()), digest_size=16).hexdigest()]
    if node.op == "call_function":
        target = node.target
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            formulas = _custom_op_formulas(target)
            return [str(target), formulas] if formulas else str(target)
        return _qualified_name(target)
    raise Unkeyable(f"graph node kind {node.op}")


def _custom_op_formulas(op: Any) -> list | None:
    """What AOTAutograd traces of a ``torch.library.custom_op`` besides its name: its registered backward,
    setup_context and fake implementation, by their code (the kernel itself stays one opaque node, called at run
    time, so its body is not keyed). A backward edited under the same op name is then another program (PyTorch's
    FX graph cache missed this: pytorch #144344). None for every other op."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(getattr(op, "_name", ""))
    if opdef is None:
        return None
    return [_code_digest(f) for f in (opdef._backward_fn, opdef._setup_context_fn, opdef._abstract_fn)]


def _code_digest(fn: Any) -> str | None:
    """A digest of a function's code: bytecode, constants, names, defaults and plain closure values; the same in
    every process of one Python version, whatever the file's path or line. Functions it calls are keyed by name
    only (an edit inside a helper the backward calls is not seen: keep a formula's arithmetic in the formula)."""
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        raise Unkeyable(f"custom op formula {fn!r:.60} has no Python code to key")
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _plain_value(c.cell_contents)]
    defaults = list(fn.__defaults__ or ())
    return _digest([_code_tree(code), defaults if _plain_value(defaults) else None, cells])


def _code_tree(code: Any) -> list:
    return [code.co_code, [_const(c) for c in code.co_consts], list(code.co_names), code.co_argcount]


def _const(c: Any) -> Any:
    if hasattr(c, "co_code"):
        return _code_tree(c)
    if isinstance(c, frozenset):  # ``x in {"a", "b"}``: its order follows string hashes, which vary per process
        return sorted(repr(x) for x in c)
    if isinstance(c, tuple):
        return [_const(x) for x in c]
    return repr(c)


def _plain_value(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_plain_value(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def _qualified_name(target: Any) -> str:
    """``module.qualname`` of a function, or of a local function its module exports under ``__name__``
    (``torch.nn.functional.max_pool2d`` is made by a factory); Unkeyable for anything else."""
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and name and "<" not in name:
        return f"{module}.{name}"
    short = getattr(target, "__name__", None)
    if module and short and getattr(sys.modules.get(module), short, None) is target:
        return f"{module}.{short}"
    raise Unkeyable(f"call target {target!r:.60} has no stable name")


_TAGGED = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _canon(arg: Any, names: dict) -> Any:
    """Plain, stable data for an FX argument; Unkeyable for anything else."""
    if isinstance(arg, torch.fx.Node):
        return {"r": names[arg]}
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return arg
    if isinstance(arg, torch.Size):
        return {"size": list(arg)}
    if isinstance(arg, tuple):
        return {"tuple": [_canon(a, names) for a in arg]}
    if isinstance(arg, list):
        return [_canon(a, names) for a in arg]
    if isinstance(arg, dict) and all(isinstance(k, str) for k in arg):
        return {"dict": [[k, _canon(v, names)] for k, v in sorted(arg.items())]}
    if isinstance(arg, slice):
        return {"slice": [_canon(a, names) for a in (arg.start, arg.stop, arg.step)]}
    if arg is Ellipsis:
        return {"ellipsis": True}
    if isinstance(arg, _TAGGED):
        return {type(arg).__name__: str(arg)}
    raise Unkeyable(f"graph argument of type {type(arg).__name__}")


def _input(fake: Any, real: Any, rename: dict[str, str]) -> list:
    from ..formats import symexpr

    try:
        if isinstance(fake, torch.Tensor):
            stride = [symexpr.encode(s, rename) for s in fake.stride()] if fake.layout == torch.strided else []
            return ["tensor", str(fake.dtype), [symexpr.encode(s, rename) for s in fake.shape], stride,
                    bool(real.requires_grad), isinstance(real, torch.nn.Parameter), fake.device.type,
                    str(fake.layout)]
        if isinstance(fake, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return ["sym", symexpr.encode(fake, rename)]
    except symexpr.SymExprError as e:
        raise Unkeyable(str(e)) from None
    if fake is None or isinstance(fake, (bool, int, float)):
        return ["scalar", fake]
    raise Unkeyable(f"graph input of type {type(fake).__name__}")


def _dynamo_guards(rename: dict[str, str]) -> list:
    """The guards Dynamo's trace put on the graph's shape symbols (one graph per guard set: a
    recompile for ``batch >= 16`` is another program than the graph for ``batch < 16``)."""
    from ..lowering import encode_guards

    tracing = torch._guards.TracingContext.try_get()
    shape_env = getattr(getattr(tracing, "fake_mode", None), "shape_env", None)
    return [] if shape_env is None else encode_guards([g.expr for g in shape_env.guards], rename)


def _global_state() -> list:
    """Global state that changes what AOTAutograd makes of a graph, as AOTAutogradCache keys it: grad mode,
    autocast per device type, deterministic algorithms, the default dtype and AOTAutograd's configuration
    (every option not marked compile-ignored). Unkeyable on a torch without the private calls used here."""
    from torch._functorch import config as aot_config

    try:
        autocast = [[d, str(torch.get_autocast_dtype(d))] for d in torch._C._autocast_supported_devices()
                    if torch.is_autocast_enabled(d)]
        config = aot_config.get_hash().hex()
    except (AttributeError, RuntimeError, TypeError) as e:
        raise Unkeyable(f"this torch's autocast or AOTAutograd configuration cannot be read: {e}") from None
    return [torch.is_grad_enabled(), autocast, torch.is_autocast_cache_enabled(),
            torch.are_deterministic_algorithms_enabled(), str(torch.get_default_dtype()), config]


def _spec(s) -> list:
    return [s.kind, s.dtype, s.shape, s.stride, s.expr]


def _norm(arg: Any, names: dict[str, str]) -> Any:
    if isinstance(arg, dict):
        if len(arg) == 1 and "r" in arg:
            return {"r": names[arg["r"]]}
        if len(arg) == 1 and "device" in arg:
            # The recipe is for the HPU; the host device it was traced on (cpu, or meta for a
            # compile-only prebuild) does not change it.
            return {"device": "*"}
        return {k: _norm(v, names) for k, v in sorted(arg.items())}
    if isinstance(arg, (list, tuple)):
        return [_norm(a, names) for a in arg]
    return arg


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
