"""A recipe that came from outside this process, run on meta tensors at a call's real input signature before
it runs for real: every op must have a meta kernel, and every node's result must be what the recipe declares.

Host kernels trust their callers' shapes (a kernel handed a matrix of the wrong size may read past its buffer
and crash the process); their meta kernels check them and raise. A stored recipe is data, so its node specs
and the shapes its ops would be handed are checked here, against the inputs of the call about to run it: a
refusal is a ``RecipeLoadError``, a cache miss like any other load failure. Recipes lowered in this process
are not checked (their node specs are what tracing computed).

An op without a meta kernel (or one whose result depends on the data, such as ``nonzero``) cannot be checked
and is refused: running it on the host is what the check is there to avoid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import one_line
from ..formats import symexpr
from ..formats.recipe import Constant, Recipe, ValueSpec
from .executor import RecipeLoadError, _Codegen, dtype_from_name, load_constant


class MetaCodegen(_Codegen):
    """The recipe's code with every device set to meta and every value kept: shapes, no storage."""

    def tagged(self, tag: str, v: Any) -> str:
        return self.bind(torch.device("meta")) if tag == "device" else super().tagged(tag, v)

    def free(self, names) -> None:
        pass


def meta_run(recipe: Recipe, args: list) -> list:
    """Every node's value (in node order) when the recipe runs on ``args`` (meta tensors, ints, None)."""
    consts = {name: meta_constant(c) for name, c in recipe.constants.items()}
    every = [{"r": n.name} for n in recipe.nodes]
    gen = MetaCodegen(dataclasses.replace(recipe, constants={}, outputs=every), consts)
    source = gen.render()
    namespace = dict(gen.bound)
    exec(compile(source, f"<check {recipe.name}>", "exec"), namespace)  # generated from checked structure
    with torch.device("meta"), torch.no_grad():
        return namespace["run"](list(args))


def meta_constant(c: Constant) -> torch.Tensor:
    load_constant(Constant(c.dtype, c.shape, c.data))  # its bytes match its shape
    return torch.empty(c.shape, dtype=dtype_from_name(c.dtype), device="meta")


def signature(args: list) -> tuple:
    """What a meta run of a recipe depends on in its inputs: each tensor's shape, strides and dtype, each other
    value as it is (symbol values)."""
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def check_call(recipe: Recipe, args: list) -> None:
    """RecipeLoadError unless the recipe, run on meta tensors shaped as ``args``, has a meta kernel for every op
    and every node makes what it declares (kind, dtype, shape; strides where declared)."""
    env = _symbol_values(recipe, args)
    metas = [_as_meta(a) for a in args]
    for name, spec, arg in zip(recipe.input_names, recipe.inputs, metas):
        _compare(f"input {name!r:.40}", spec, arg, env)
    try:
        values = meta_run(recipe, metas)
    except RecipeLoadError:
        raise
    except Exception as e:  # a meta kernel's shape check, a missing meta kernel, a malformed argument
        raise RecipeLoadError(f"does not run on these inputs' shapes: {one_line(e, 160)}") from None
    for node, value in zip(recipe.nodes, values):
        outs = value if len(node.out) > 1 and isinstance(value, (tuple, list)) else [value]
        if len(node.out) > 1 and len(outs) != len(node.out):
            raise RecipeLoadError(f"node {node.name!r:.40} ({node.op}) makes {len(outs)} values, "
                                  f"declares {len(node.out)}")
        for spec, out in zip(node.out, outs):
            _compare(f"node {node.name!r:.40} ({node.op})", spec, out, env)


def _symbol_values(recipe: Recipe, args: list) -> dict[str, int]:
    env = {}
    for sym, (i, dim) in zip(recipe.symbols, recipe.symbol_sources):
        v = args[i] if dim < 0 else args[i].shape[dim] if isinstance(args[i], torch.Tensor) else None
        if type(v) is not int:
            raise RecipeLoadError(f"symbol {sym} reads no size from input {i}")
        env[sym] = v
    return env


def _as_meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    return a


def _compare(what: str, spec: ValueSpec, value: Any, env: dict[str, int]) -> None:
    """RecipeLoadError if a tensor spec does not describe ``value`` (other kinds are not compared: a symbolic
    value's expression may name sizes only the call knows)."""
    if spec.kind != "tensor":
        return
    if not isinstance(value, torch.Tensor):
        raise RecipeLoadError(f"{what} declares a tensor, makes {type(value).__name__}")
    try:
        shape = [symexpr.evaluate(d, env) for d in spec.shape]
        stride = [symexpr.evaluate(d, env) for d in spec.stride]
    except symexpr.SymExprError as e:
        raise RecipeLoadError(f"{what}: {e}") from None
    if dtype_from_name(spec.dtype) != value.dtype or shape != list(value.shape):
        raise RecipeLoadError(f"{what} declares {spec.dtype}{shape}, makes "
                              f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
    if len(stride) == len(shape) and stride and not _same_strides(stride, value):
        raise RecipeLoadError(f"{what} declares strides {stride}, makes {list(value.stride())}")


def _same_strides(stride: list[int], value: torch.Tensor) -> bool:
    """Strides agree wherever they matter: a dimension of size 1 (or any dimension of an empty tensor) may have
    any stride, as torch's own layout comparisons allow."""
    if value.numel() == 0:
        return True
    return all(a == b or n == 1 for a, b, n in zip(stride, value.stride(), value.shape))
