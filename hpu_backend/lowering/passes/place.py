"""Place: every node on the HPU (with its engine) or the CPU, as the bridge decides from the op table.

An op falls back to the CPU when the table does not list it, when a dtype it reads or writes is
not supported, when the user names it in ``place_on_cpu`` (``PT_HPU_PLACE_ON_CPU``), or when it is a
library's custom op (``torch.library``; named with its own namespace). Strict mode turns a fallback
into a LoweringError naming the op and dtype, except a library op's: that is a known fallback. Symbolic-int ops,
and host scalar maths (``host_scalars``: float64 0-dim values computed from sizes and Python floats), run on
the host while the recipe launches and feed the device as kernel parameters; they are not fallbacks.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from ...formats.recipe import Node, Recipe
from .. import optable
from ..context import LoweringContext
from ..errors import LoweringError
from ..values import is_tensor_value, node_refs, spec_map, tensor_dtypes, with_fields

# c10 ScalarType names, as the bridge prints them in "HPU<Name>Type".
SCALAR_TYPE = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble", "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2",
}

LIBRARY_OP = "library custom op (torch.library): no HPU kernel, runs on the CPU"


def place(recipe: Recipe, ctx: LoweringContext, table: optable.OpTable | None = None) -> Recipe:
    table = table or optable.shared_table()
    specs = spec_map(recipe)
    scalars = host_scalars(recipe, specs)
    nodes, placed, fallbacks = [], {}, []
    for node in recipe.nodes:
        refs = node_refs(node)
        if node.name in scalars:
            why, decision = None, {"placement": "hpu", "engine": "host"}
        else:
            refs_read = [r for r in refs if r not in scalars]  # a host scalar is a kernel parameter
            runs = _op_it_runs(node)
            why = _fallback_reason(runs, refs_read, specs, placed, table, ctx.settings.place_on_cpu)
            decision = {"placement": "cpu", "engine": "cpu"} if why else _decide(runs, refs, specs, placed, table)
            if why is not None:
                fallbacks.append(_fallback(runs, specs, why, ctx))  # named by the op that falls back
        node = with_fields(node, **decision)
        placed[node.name] = node.placement
        nodes.append(node)
    engines = Counter(n.engine for n in nodes)
    facts = dict(recipe.facts, placement={"fallbacks": fallbacks, "engines": dict(sorted(engines.items()))})
    return dataclasses.replace(recipe, nodes=nodes, facts=facts)


# Ops the host evaluates on 0-dim values while it launches a recipe: Python float maths on sizes and
# unspecialized floats (``x.shape[-1] ** 0.5``, an ``eps`` attribute), which AOTAutograd writes as float64
# 0-dim tensor ops.
SCALAR_MATH = frozenset("""
convert_element_type _to_copy scalar_tensor true_divide div mul add sub rsub neg reciprocal sqrt rsqrt pow exp log
floor ceil round trunc abs clamp clamp_min clamp_max maximum minimum
""".split())


def host_scalars(recipe: Recipe, specs) -> set[str]:
    """Values that are host-side scalar arithmetic: 0-dim float64 inputs (Python floats Dynamo passes as
    tensors; the device has no float64, so nothing else makes them), 0-dim float64 results of scalar maths
    on no tensor at all (``scalar_tensor(2.0, dtype=float64)``, sizes turned into floats), and any 0-dim
    result of scalar maths over host scalars only (the float32 value finally fed to a device kernel)."""
    found = {name for name, spec in zip(recipe.input_names, recipe.inputs) if _is_scalar(spec, "float64")}
    for node in recipe.nodes:
        if node.op.partition("::")[0] not in ("aten", "prims") or optable.packet_name(node.op) not in SCALAR_MATH:
            continue
        if len(node.out) != 1 or not _is_scalar(node.out[0]):
            continue
        tensors = [r for r in node_refs(node) if is_tensor_value(specs.get(r))]
        if all(r in found for r in tensors) and (tensors or node.out[0].dtype == "float64"):
            found.add(node.name)
    return found


def _is_scalar(spec, dtype: str | None = None) -> bool:
    return spec.kind == "tensor" and spec.shape == [] and (dtype is None or spec.dtype == dtype)


def _decide(node: Node, refs: list[str], specs, placed: dict[str, str], table: optable.OpTable) -> dict:
    """The placement and engine of a node that does not fall back."""
    if _is_element_of(node, refs, specs, placed):
        return {"placement": placed[refs[0]], "engine": "view"}  # an element of a multi-output op
    if optable.is_host_op(node.op):
        return {"placement": "hpu", "engine": "host"}
    return {"placement": "hpu", "engine": table.lookup(node.op).engine}


EFFECTS = "higher_order::with_effects"


def _op_it_runs(node: Node) -> Node:
    """The node as the op it runs: ``with_effects`` is the wrapper AOTAutograd puts around an effectful op
    (``aten::_linalg_check_errors``, a print) to keep it in order; it is placed, and falls back, as that op."""
    if node.op == EFFECTS and len(node.args) > 1 and isinstance(node.args[1], dict) \
            and isinstance(node.args[1].get("op"), str):
        return with_fields(node, op=node.args[1]["op"], args=node.args[2:])  # without the token and the op
    return node


def _is_element_of(node: Node, refs: list[str], specs, placed) -> bool:
    return (node.op == "operator::getitem" and bool(refs) and refs[0] in placed
            and is_tensor_value(specs.get(refs[0])))


def _fallback_reason(node: Node, refs: list[str], specs, placed, table: optable.OpTable,
                     on_cpu: frozenset) -> str | None:
    """Why a node falls back to the CPU, or None if it runs on the HPU (or the host)."""
    if _is_element_of(node, refs, specs, placed) or optable.is_host_op(node.op):
        return None
    if optable.is_library_op(node.op):
        return LIBRARY_OP
    if _user_placed_on_cpu(node.op, on_cpu):
        return "placed on CPU by PT_HPU_PLACE_ON_CPU"
    record = table.lookup(node.op)
    if record is None:
        return "op not supported on HPU"
    dtypes = _dtypes(node, refs, specs)
    if not record.capable(dtypes):
        bad = [d for d in dtypes if d not in record.dtypes]
        return f"dtype {', '.join(bad)} not supported on HPU"
    return None


def _dtypes(node: Node, refs: list[str], specs) -> list[str]:
    """Dtypes the op reads and writes (the bridge checks both)."""
    found = [d for r in refs for d in tensor_dtypes(specs.get(r))]
    return sorted(set(found + tensor_dtypes(node.out)))


def _user_placed_on_cpu(op: str, names: frozenset) -> bool:
    """PT_HPU_PLACE_ON_CPU names ops as ``digamma``, ``aten::digamma`` or ``aten::digamma.default``."""
    return bool(names) and bool({_short_name(op), optable.qualified_name(op), op} & names)


def placed_on_cpu_by(op: str, name: str) -> bool:
    """Whether the PT_HPU_PLACE_ON_CPU entry ``name`` places ``op`` (recipe keys keep only the entries that do)."""
    return _user_placed_on_cpu(op, frozenset([name]))


def _short_name(op: str) -> str:
    """How the bridge prints an op: its packet name for ATen, the qualified name for any other namespace."""
    return optable.packet_name(op) if op.startswith("aten::") else optable.qualified_name(op)


def _fallback(node: Node, specs, why: str, ctx: LoweringContext) -> dict:
    """The fallback record. Strict mode refuses it unless the op is a library's custom op, which has no
    device kernel anywhere (on Gaudi too it runs on the CPU): a known fallback, not an unsupported ATen op."""
    dtypes = _dtypes(node, node_refs(node), specs)
    name, library = optable.qualified_name(node.op), why == LIBRARY_OP
    if ctx.settings.strict and not library:
        raise LoweringError(f"CPU fallback of {name} ({', '.join(dtypes) or 'no tensors'}) "
                            f"in strict mode: {why}", node=_fx_node(ctx, node.name))
    return {"node": node.name, "op": name, "dtypes": dtypes, "reason": why, "library": library,
            "line": f"CPU fallback {_short_name(node.op)} : {_arg_types(node, specs)}".rstrip()}


def _arg_types(node: Node, specs) -> str:
    """``self=HPUBFloat16Type other=HPUFloatType``: the tensor arguments by schema name."""
    names = _schema_arg_names(node.op)
    parts = []
    for i, a in enumerate(node.args):
        dts = [d for r in node_refs(Node("", "", [a], {}, [])) for d in tensor_dtypes(specs.get(r))]
        if dts:
            name = names[i] if i < len(names) else f"arg{i}"
            parts.append(f"{name}={','.join(f'HPU{SCALAR_TYPE.get(d, d)}Type' for d in dts)}")
    return " ".join(parts)


def _schema_arg_names(op: str) -> list[str]:
    namespace, _, rest = op.partition("::")
    packet, _, overload = rest.partition(".")
    try:
        schema = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")._schema
    except (AttributeError, RuntimeError):
        return []
    return [a.name for a in schema.arguments]


def _fx_node(ctx: LoweringContext, name: str):
    gm = ctx.gm
    if gm is None:
        return None
    return next((n for n in gm.graph.nodes if n.name == name), None)
