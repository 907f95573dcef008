"""A recipe that came from outside this process, run on meta tensors at a call's real input signature before
it runs for real: every meta kernel must accept what it is handed, and every node make what the recipe declares.

Host kernels trust their callers' shapes (a kernel handed a matrix of the wrong size may read past its buffer
and crash the process); their meta kernels check them and raise. A stored recipe is data, so its node specs
and the shapes its ops would be handed are checked here, against the inputs of the call about to run it: a
refusal is a ``RecipeLoadError``, a cache miss like any other load failure. Recipes lowered in this process
are not checked (their node specs are what tracing computed).

What is compared: each tensor a node makes that another node takes, its dtype and its shape; a multi-output or
list-returning op's items where ``getitem`` takes them. A value that only leaves the recipe (or that nothing
reads) flows into no kernel, and may be shaped differently by the meta and the host kernel (batch norm's saved
statistics in eval mode are empty on the host). Strides are not compared: some meta kernels lay out a
result differently from their host kernels (``_fft_r2c``, ``linalg_eig``), and the meta run already uses the
call's real strides, so a kernel's own stride checks apply.

An op with no meta kernel at all (``geqrf``, ``histogram``: CPU-fallback ops) cannot be checked: its declared
results stand in for it in the meta run, and it runs as it always has. The families of host kernels known to
crash the process never get here: the runtime allowlist refuses them when the recipe is built (``ops.DENY_ATEN``,
tagged enums), and it must, because some of them crash on meta tensors too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from ..errors import one_line
from ..formats import symexpr
from ..formats.recipe import Constant, Node, Recipe, ValueSpec, iter_refs
from . import ops
from .executor import RecipeLoadError, _Codegen, dtype_from_name, load_constant


class MetaCodegen(_Codegen):
    """The recipe's code with every device set to meta and every value kept: shapes, no storage. With ``env``
    (symbol values), an op without a meta kernel makes the meta tensors its node declares."""

    def __init__(self, recipe: Recipe, fixed: dict, env: dict[str, int] | None = None):
        super().__init__(recipe, fixed)
        self.env = env

    def tagged(self, tag: str, v: Any) -> str:
        return self.bind(torch.device("meta")) if tag == "device" else super().tagged(tag, v)

    def callable_for(self, node) -> Callable:
        standard = ops.standard_callable(node.op)  # no fast path: its retry would only repeat a meta error
        if self.env is None or not isinstance(ops.resolve(node.op), torch._ops.OpOverload):
            return standard
        return functools.partial(_or_declared, standard, node, self.env)

    def free(self, names) -> None:
        pass


_NO_META = "no fake impl or Meta kernel registered"  # the dispatcher's words for an op without a meta kernel


def _or_declared(op: Callable, node: Node, env: dict[str, int], *args, **kwargs) -> Any:
    """``op``'s meta result; the node's declared results if the op has no meta kernel."""
    try:
        return op(*args, **kwargs)
    except NotImplementedError as e:
        if _NO_META not in str(e) or not node.out or any(s.kind != "tensor" for s in node.out):
            raise  # (a data-dependent op's meta kernel raises NotImplementedError too: refused)
    made = [torch.empty([symexpr.evaluate(d, env) for d in s.shape], dtype=dtype_from_name(s.dtype),
                        device="meta") for s in node.out]
    return made[0] if len(made) == 1 else tuple(made)


def meta_run(recipe: Recipe, args: list, env: dict[str, int] | None = None) -> list:
    """Every node's value (in node order) when the recipe runs on ``args`` (meta tensors, ints, None); ``env``:
    the symbol values, when the declared results of ops without a meta kernel may stand in for them."""
    consts = {name: meta_constant(c) for name, c in recipe.constants.items()}
    every = [{"r": n.name} for n in recipe.nodes]
    gen = MetaCodegen(dataclasses.replace(recipe, constants={}, outputs=every), consts, env)
    source = gen.render()
    namespace = dict(gen.bound)
    exec(compile(source, f"<check {recipe.name}>", "exec"), namespace)  # generated from checked structure
    with torch.device("meta"), torch.no_grad():
        return namespace["run"](list(args))


def meta_constant(c: Constant) -> torch.Tensor:
    load_constant(Constant(c.dtype, c.shape, c.data))  # its bytes match its shape
    return torch.empty(c.shape, dtype=dtype_from_name(c.dtype), device="meta")


def signature(args: list) -> tuple:
    """What a meta run of a recipe depends on in its inputs: each tensor's layout and dtype, each other
    plain value as it is (symbol values), anything else by its type."""
    return tuple((tuple(a.shape), a.stride(), a.storage_offset(), a.dtype) if isinstance(a, torch.Tensor)
                 else a if isinstance(a, (int, float, str, type(None))) else type(a) for a in args)


def check_call(recipe: Recipe, args: list) -> None:
    """RecipeLoadError unless the recipe, run on meta tensors shaped as ``args``, makes at every node what the node
    declares (a tensor of its dtype and shape), and every input tensor is what the recipe declares."""
    if len(args) != len(recipe.inputs):
        raise RecipeLoadError(f"takes {len(recipe.inputs)} inputs, the call passes {len(args)}")
    env = _symbol_values(recipe, args)
    metas = [_as_meta(a) for a in args]
    for name, spec, arg in zip(recipe.input_names, recipe.inputs, metas):
        if isinstance(arg, torch.Tensor):  # None may stand for an optional tensor; the meta run gets it as is
            _compare(f"input {name!r:.40}", spec, arg, env)
    try:
        values = meta_run(recipe, metas, env)
    except RecipeLoadError:
        raise
    except Exception as e:  # a meta kernel's shape check, a missing meta kernel, a malformed argument
        raise RecipeLoadError(f"does not run on these inputs' shapes: {one_line(e, 160)}") from None
    read = set(iter_refs([[n.args, list(n.kwargs.values())] for n in recipe.nodes]))
    for node, value in zip(recipe.nodes, values):
        if node.out and node.name in read and not isinstance(value, (tuple, list)):  # items: where getitem reads
            _compare(f"node {node.name!r:.40} ({node.op})", node.out[0], value, env)


def _symbol_values(recipe: Recipe, args: list) -> dict[str, int]:
    env = {}
    for sym, (i, dim) in zip(recipe.symbols, recipe.symbol_sources):
        v = args[i] if dim < 0 else args[i].shape[dim] if isinstance(args[i], torch.Tensor) else None
        if type(v) is not int:
            raise RecipeLoadError(f"symbol {sym} reads no size from input {i}")
        env[sym] = v
    return env


def _as_meta(a: Any) -> Any:
    """A meta tensor laid out as ``a`` in a storage of ``a``'s size (an ``as_strided`` node checks its bounds)."""
    if not isinstance(a, torch.Tensor):
        return a
    try:
        elements = a.untyped_storage().nbytes() // a.element_size()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without a storage of its own
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    storage = torch.empty(elements, dtype=a.dtype, device="meta")
    return storage.as_strided(a.shape, a.stride(), a.storage_offset())


def _compare(what: str, spec: ValueSpec, value: Any, env: dict[str, int]) -> None:
    """RecipeLoadError if a tensor spec does not describe ``value`` (other kinds are not compared: a symbolic
    value's expression may name sizes only the call knows)."""
    if spec.kind != "tensor":
        return
    if not isinstance(value, torch.Tensor):
        raise RecipeLoadError(f"{what} declares a tensor, makes {type(value).__name__}")
    try:
        shape = [symexpr.evaluate(d, env) for d in spec.shape]
    except symexpr.SymExprError as e:
        raise RecipeLoadError(f"{what}: {e}") from None
    if dtype_from_name(spec.dtype) != value.dtype or shape != list(value.shape):
        raise RecipeLoadError(f"{what} declares {spec.dtype}{shape}, makes "
                              f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
