"""Recipe → fast callable: straight-line Python over allowlisted ops, intermediates freed at last use.

The generated function is built only from the recipe's structure: value names become ``v{i}``,
ops become names bound to callables from ``ops.resolve``, and constants that are not plain
literals (dtypes, devices, tensors, non-finite floats) become bound names. No text stored in a
recipe is ever executed: strings appear only through ``repr`` of a checked ``str``.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import logging
import math
import re
from typing import Any, Callable, Mapping

import torch

from ..formats.recipe import Constant, Recipe, iter_refs
from . import collectives, ops
from .peephole import fold_linear
from .symbolic import SymbolicError, symbolic_values
from .writes import UndeclaredWrite, check_writes
from ..errors import HpuBackendError

log = logging.getLogger(__name__)

_KWARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: "$" would allow a trailing newline

INFIX = {  # +, -, *, % and ** are calls: ops.resolve bounds what they make (integers, repeated sequences)
    "operator::floordiv": "//", "operator::truediv": "/", "operator::eq": "==",
    "operator::ne": "!=", "operator::lt": "<", "operator::le": "<=", "operator::gt": ">",
    "operator::ge": ">=",
}

DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format,
}


class RecipeLoadError(HpuBackendError, ValueError):
    """A recipe that cannot be turned into a callable (unknown op, bad argument form)."""


_fast_path_warned: set[str] = set()


def fast_path_failed(op: str, standard: Callable, error: Exception) -> Callable:
    """The standard call of ``op`` after its fast path raised ``error`` (warned once per op and process).
    A genuine error of the op (eager would raise it too) raises again from the standard call."""
    if op not in _fast_path_warned:
        _fast_path_warned.add(op)
        log.warning("hpu_backend: the fast path of %s failed (%s: %s); calling the op through the dispatcher",
                    op, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
    return standard


def copy_compact(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten.copy`` (``copy_``'s functional form) into memory of ``self``'s own size. ATen's returns a copy of
    ``self``'s whole storage, as large as the flat buffer a slice comes from (2 GB for a slice of DeepSpeed's
    gradient bucket); the values, shape and strides are the same, only the storage and its offset differ, so the
    executor takes this form only in lazy graphs (whose results are copied into the tensors the script holds,
    which keep their own layouts) where no op reads a storage offset (``as_strided``, ``set_``)."""
    out = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.device)
    return out.copy_(src, non_blocking)


_STORAGE_RELATIVE = ("aten::as_strided", "aten::set_")  # ops that address a tensor's storage, not the tensor


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise RecipeLoadError(f"unknown dtype {name!r}") from None


def host_device(name: str) -> torch.device:
    """The device a recipe's ``device=`` argument names, as the host runs it: the simulated hpu device's
    memory is host memory, so a tensor a recipe makes on ``hpu`` (``arange(n, device=x.device)`` in a compiled
    graph) is made on the CPU, beside the host tensors of its device inputs."""
    device = torch.device(name)
    return torch.device("cpu") if device.type == "hpu" else device


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device.type in (device.type, "meta") else t.to(device)  # meta: the recipe's dry run


def load_constant(c: Constant) -> torch.Tensor:
    """The constant's tensor; its bytes must be exactly what its shape and dtype declare (checked
    before anything is allocated, so a forged shape cannot ask for more memory than was stored)."""
    dtype = check_constant(c)
    if not c.data:
        return torch.empty(c.shape, dtype=dtype)
    return torch.frombuffer(bytearray(c.data), dtype=dtype).reshape(c.shape)


def check_constant(c: Constant) -> torch.dtype:
    """The constant's dtype; RecipeLoadError unless its bytes are exactly what its shape and dtype declare."""
    dtype = dtype_from_name(c.dtype)
    if not all(type(d) is int and d >= 0 for d in c.shape):
        raise RecipeLoadError(f"constant shape {c.shape!r:.60} is not a list of sizes")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if math.prod(c.shape) * itemsize != len(c.data):
        raise RecipeLoadError(f"constant of shape {c.shape!r:.60} and dtype {c.dtype} "
                              f"holds {len(c.data)} bytes")
    return dtype


class _Codegen:
    """Renders one recipe into the source of ``run(args)`` plus the names it binds."""

    def __init__(self, recipe: Recipe, fixed: Mapping[str, torch.Tensor] | None = None):
        self.recipe = recipe
        self.fixed = fixed or {}  # inputs bound at build time (an HPU graph's parameters), by input name
        self.var: dict[str, str] = {}
        self.bound: dict[str, Any] = {}
        self.folded: set[str] = set()  # values computed at build time: fixed inputs and views of them
        self.lines: list[str] = []
        self.standard: dict[str, str] = {}  # node name -> bound fallback of its fast path
        self.compact_copy = recipe.kind == "lazy" and not any(n.op.startswith(_STORAGE_RELATIVE) for n in recipe.nodes)

    def bind(self, value: Any, prefix: str = "c") -> str:
        name = f"{prefix}{len(self.bound)}"
        self.bound[name] = value
        return name

    def arg(self, a: Any) -> str:
        if a is None or isinstance(a, (bool, int)):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else self.bind(a)
        if isinstance(a, str):
            return repr(a)
        if isinstance(a, list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, dict) and len(a) == 1:
            ((tag, v),) = a.items()
            return self.tagged(tag, v)
        raise RecipeLoadError(f"unsupported argument form {a!r:.80}")

    def tagged(self, tag: str, v: Any) -> str:
        if tag == "r":
            if v not in self.var:
                raise RecipeLoadError(f"reference to undefined value {v!r}")
            return self.var[v]
        if tag == "dtype":
            return self.bind(dtype_from_name(v))
        if tag == "device":
            return self.bind(host_device(str(v)))
        if tag == "layout" and v in LAYOUTS:
            return self.bind(LAYOUTS[v])
        if tag == "memory_format" and v in MEMORY_FORMATS:
            return self.bind(MEMORY_FORMATS[v])
        if tag == "op" and isinstance(v, str):  # an op passed as an argument (with_effects)
            try:
                return self.bind(ops.resolve(v))
            except ops.OpNotAllowed as e:
                raise RecipeLoadError(str(e)) from None
        if tag == "complex" and isinstance(v, list) and len(v) == 2:
            return self.bind(complex(float(v[0]), float(v[1])))
        raise RecipeLoadError(f"unsupported tagged argument {tag!r}={v!r:.60}")

    def call(self, node) -> str:
        args = [self.arg(a) for a in node.args]
        for k, v in node.kwargs.items():
            if not isinstance(k, str) or not _KWARG.fullmatch(k) or keyword.iskeyword(k):
                raise RecipeLoadError(f"bad keyword argument name {k!r} in node {node.name}")
            args.append(f"{k}={self.arg(v)}")
        if node.op in INFIX and len(args) == 2:
            return f"{args[0]} {INFIX[node.op]} {args[1]}"
        if node.op == "operator::getitem" and len(args) == 2:
            return f"{args[0]}[{args[1]}]"
        try:
            fn = self.callable_for(node)
            collectives.check_runnable(node)
        except (ops.OpNotAllowed, collectives.CollectiveError) as e:
            raise RecipeLoadError(str(e)) from None
        return f"{self.bind(fn, 'f')}({', '.join(args)})"

    def callable_for(self, node) -> Callable:
        """What runs a node's op: its fast path, with the standard call as its fallback (see ``statement``)."""
        fn = ops.fast_callable(node.op)
        standard = ops.standard_callable(node.op)
        if node.op == "aten::copy.default" and self.compact_copy:
            fn = copy_compact
        if fn is not standard:
            self.standard[node.name] = self.bind(functools.partial(fast_path_failed, node.op, standard), "s")
        return fn

    def statement(self, node, target: str, expr: str) -> list[str]:
        """``target = expr``; a fast-path call retries as the standard op call if it raises (one warning per op).
        Python 3.11's exception handling costs nothing until something raises."""
        retry = self.standard.get(node.name)
        if retry is None:
            return [f"    {target} = {expr}"]
        call_args = expr[expr.index("("):]
        return ["    try:", f"        {target} = {expr}", "    except Exception as e:",
                f"        {target} = {retry}(e){call_args}"]

    def render(self) -> str:
        r = self.recipe
        passed = [n for n in r.input_names if n not in self.fixed]
        for i, name in enumerate(passed):
            self.var[name] = f"a{i}"
        for name, tensor in self.fixed.items():
            self.var[name] = self.bind(tensor, "p")
            self.folded.add(name)
        for name, const in r.constants.items():
            self.var[name] = self.bind(load_constant(const), "k")
        last_use = self.last_uses()
        self.made_on = {n.name: n.out[0].device for n in r.nodes
                        if len(n.out) == 1 and n.out[0].kind == "tensor" and n.out[0].device not in ("", "cpu")}
        self.lines.append("def run(args):")
        if passed:
            self.lines.append(f"    {', '.join(self.var[n] for n in passed)}, = args")
            self.lines.append("    args.clear()")
            self.free(last_use.get("<inputs>", ()))
        for i, node in enumerate(r.nodes):
            expr = self.call(node)
            if self.foldable(node):
                self.var[node.name] = self.bind(eval(expr, dict(self.bound)), "p")  # generated above, not stored text
                self.folded.add(node.name)
                continue
            self.var[node.name] = f"v{i}"
            self.lines.extend(self.statement(node, f"v{i}", expr))
            self.free(last_use.get(node.name, ()))
        self.lines.append(f"    return [{', '.join(self.output(o) for o in r.outputs)}]")
        return "\n".join(self.lines) + "\n"

    def output(self, o: Any) -> str:
        """An output as the caller gets it: a tensor the graph made on the hpu device (``host_device`` made it
        on the host) goes back to the device, as a device tensor."""
        expr = self.arg(o)
        made = self.made_on.get(o.get("r")) if isinstance(o, dict) else None
        return f"{self.bind(_to_device, 'd')}({expr}, {self.bind(torch.device(made))})" if made else expr

    def foldable(self, node) -> bool:
        """A view of fixed inputs only (``t(weight)``): computed once at build time. Only views, so that
        an in-place update of a parameter (``load_state_dict``) is still seen by every later call."""
        if not self.fixed:
            return False
        refs = list(iter_refs([node.args, list(node.kwargs.values())]))
        op = ops.resolve(node.op)
        return bool(refs) and all(r in self.folded for r in refs) and getattr(op, "is_view", False)

    def last_uses(self) -> dict[str, list[str]]:
        """Map a node name to the values whose last reader it is (freed right after it runs)."""
        kept = set(iter_refs(self.recipe.outputs)) | set(self.recipe.constants)
        last: dict[str, str] = {}
        for name in self.recipe.input_names:
            last[name] = "<inputs>"
        for node in self.recipe.nodes:
            last[node.name] = node.name  # unused results die right away
            for ref in iter_refs([node.args, list(node.kwargs.values())]):
                last[ref] = node.name
        out: dict[str, list[str]] = {}
        for value, at in last.items():
            if value not in kept:
                out.setdefault(at, []).append(value)
        return out

    def free(self, names) -> None:
        names = [self.var[n] for n in names if n in self.var and n not in self.folded]
        if names:
            self.lines.append(f"    del {', '.join(names)}")



def check_ops(recipe: Recipe) -> None:
    """RecipeLoadError unless every op of the recipe is in the runtime allowlist, the inputs they write are
    exactly those the recipe declares (``writes.check_writes``), and its symbolic nodes computable without a
    call stay within their bounds and indices (``symbolic.symbolic_values``)."""
    for node in recipe.nodes:
        try:
            ops.check_arguments(node.op, ops.resolve(node.op), node.args, node.kwargs)
            collectives.check_structure(node)
        except (ops.OpNotAllowed, ValueError, collectives.CollectiveError) as e:
            raise RecipeLoadError(f"node {node.name}: {e}") from None
    try:
        check_writes(recipe)
        symbolic_values(recipe)  # the nodes computable from literals alone, by the bounded ops
    except (UndeclaredWrite, SymbolicError) as e:
        raise RecipeLoadError(str(e)) from None


def build_callable(recipe: Recipe, fixed: Mapping[str, torch.Tensor] | None = None, *,
                   checked: bool = False) -> Callable[[list], list]:
    """Compile a recipe into ``run(args: list) -> list`` (boxed: it clears ``args``).

    ``fixed`` binds some inputs once, by name (an HPU graph's parameters): ``args`` then holds only
    the others, in order, and views of fixed inputs (a transposed weight) are taken once, here.
    ``checked``: ``check_ops`` has passed on this recipe already (a package checks every bucket at load).

    Any failure, whatever its type, is a RecipeLoadError: a stored recipe that cannot be built is
    a cache miss, never a crash.
    """
    try:
        if not checked:
            check_ops(recipe)
        return _build(recipe, fixed or {})
    except RecipeLoadError:
        raise
    except Exception as e:  # a malformed recipe may fail anywhere in codegen; all of it is a load error
        raise RecipeLoadError(f"{type(e).__name__}: {e}") from e


def _build(recipe: Recipe, fixed: Mapping[str, torch.Tensor]) -> Callable[[list], list]:
    # A transpose of a fixed weight is taken once instead of being folded into linear.
    nodes = fold_linear(recipe, keep=set(fixed))
    gen = _Codegen(dataclasses.replace(recipe, nodes=nodes), fixed)
    with torch.no_grad():  # folded views of parameters must not record autograd history
        source = gen.render()
    namespace: dict[str, Any] = dict(gen.bound)
    code = compile(source, f"<recipe {recipe.name}>", "exec")
    exec(code, namespace)  # source generated above from checked structure, not stored text
    run = namespace["run"]
    run.source = source
    return run
