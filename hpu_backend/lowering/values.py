"""Helpers the placement, fusion, memory and cost passes share: value specs, refs, sizes in bytes."""

from __future__ import annotations

from typing import Any, Mapping

from ..formats import symexpr
import copy

from ..formats.recipe import Node, Recipe, ValueSpec

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
}


def with_fields(node: Node, **changes) -> Node:
    """A copy of ``node`` with some fields changed (cheaper than dataclasses.replace on hot paths)."""
    out = copy.copy(node)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def spec_map(recipe: Recipe) -> dict[str, list[ValueSpec]]:
    """Every value name (inputs, constants, node results) → its output specs."""
    specs: dict[str, list[ValueSpec]] = {n: [s] for n, s in zip(recipe.input_names, recipe.inputs)}
    for name, c in recipe.constants.items():
        specs[name] = [ValueSpec(kind="tensor", dtype=c.dtype, shape=list(c.shape))]
    for node in recipe.nodes:
        specs[node.name] = node.out
    return specs


def node_refs(node: Node) -> list[str]:
    """The value names a node reads, in argument order, each once (hot: no generators)."""
    out: list[str] = []
    stack = (
        list(reversed(node.args)) + list(reversed(node.kwargs.values())) if node.kwargs else list(reversed(node.args))
    )
    while stack:
        a = stack.pop()
        if isinstance(a, dict):
            if len(a) == 1 and "r" in a:
                if a["r"] not in out:
                    out.append(a["r"])
            else:
                stack.extend(reversed(list(a.values())))
        elif isinstance(a, list):
            stack.extend(reversed(a))
    return out


def is_tensor_value(specs: list[ValueSpec] | None) -> bool:
    return bool(specs) and any(s.kind == "tensor" for s in specs)


def tensor_dtypes(specs: list[ValueSpec] | None) -> list[str]:
    return [s.dtype for s in specs or () if s.kind == "tensor"]


def numel(spec: ValueSpec, env: Mapping[str, int]) -> int:
    n = 1
    for d in spec.shape:
        n *= int(symexpr.evaluate(d, env))
    return max(n, 0)


def nbytes(spec: ValueSpec, env: Mapping[str, int]) -> int:
    """Bytes of a dense tensor with this spec at the shape symbols ``env``; 0 for non-tensors."""
    if spec.kind != "tensor":
        return 0
    return numel(spec, env) * DTYPE_BYTES.get(spec.dtype, 4)


def numel_key(shape: list[Any]) -> tuple:
    """A symbolic element count that two shapes share iff their products are (syntactically) equal.

    ``[s0*s1, 64]`` and ``[s0, s1, 64]`` give the same key: integer factors multiply, symbolic
    factors are sorted. Good enough to see that a view keeps the iteration space.
    """
    const, factors = 1, []
    stack = list(shape)
    while stack:
        d = stack.pop()
        if isinstance(d, bool):
            factors.append(repr(d))
        elif isinstance(d, int):
            const *= d
        elif isinstance(d, list) and d and d[0] == "mul":
            stack.extend(d[1:])
        else:
            factors.append(repr(d))
    return (const, tuple(sorted(factors)))

