"""The runtime's op allowlist: the only way an op name in a recipe becomes a callable.

A name resolves when it is a registered ATen or prims schema (checked against the dispatcher's
own schema list before any attribute lookup), the op is functional (it mutates nothing, except
the input writes in ``MUTATING_ALLOWED``) and it is not in ``DENY_ATEN`` (ops that touch files or
process state); symbolic-int arithmetic resolves from the fixed ``SYM_OPS`` table. Anything else
is an ``OpNotAllowed`` error at recipe load time.
"""

from __future__ import annotations

import functools
import math
import operator

import torch


class OpNotAllowed(KeyError):
    """A recipe names an op outside the allowlist (raised by ``resolve``)."""

    def __str__(self) -> str:
        return f"op {self.args[0]!r} is not in the hpu_backend runtime allowlist"


# In-place ops that functional graphs still contain (input mutations kept in the graph).
MUTATING_ALLOWED = frozenset({"copy_"})

# Ops that read or write files or process state: never allowed, whatever their tags say.
DENY_ATEN = frozenset({"from_file", "_debug_has_internal_overlap", "set_", "_set_grad_enabled"})

def _with_effects(token, op, *args, **kwargs):
    """torch.ops.higher_order.with_effects: run an effectful op in order; the token passes through."""
    out = op(*args, **kwargs)
    return (token, *out) if isinstance(out, tuple) else (token, out)


SYM_OPS = {
    "operator::add": operator.add, "operator::sub": operator.sub, "operator::mul": operator.mul,
    "operator::floordiv": operator.floordiv, "operator::truediv": operator.truediv,
    "operator::mod": operator.mod, "operator::pow": operator.pow, "operator::neg": operator.neg,
    "operator::eq": operator.eq, "operator::ne": operator.ne, "operator::lt": operator.lt,
    "operator::le": operator.le, "operator::gt": operator.gt, "operator::ge": operator.ge,
    "operator::and_": operator.and_, "operator::or_": operator.or_, "operator::not_": operator.not_,
    "operator::getitem": operator.getitem, "math::ceil": math.ceil, "math::floor": math.floor,
    "math::sqrt": math.sqrt, "torch::sym_float": torch.sym_float, "torch::sym_int": torch.sym_int,
    "torch::sym_max": torch.sym_max, "torch::sym_min": torch.sym_min, "torch::sym_not": torch.sym_not,
    "torch::sym_sqrt": getattr(torch, "_sym_sqrt", math.sqrt),
    "higher_order::with_effects": _with_effects,
}

SYM_FUNCTIONS = {fn: name for name, fn in SYM_OPS.items() if fn is not _with_effects}
SYM_FUNCTIONS[torch.ops.higher_order.with_effects] = "higher_order::with_effects"


@functools.cache
def _registered_schemas() -> frozenset[str]:
    names = set()
    for s in torch._C._jit_get_all_schemas():
        names.add(f"{s.name}.{s.overload_name or 'default'}")
    return frozenset(names)


def op_name(target) -> str | None:
    """The recipe name of an FX call target, or None if it has no recipe name."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}::{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    return SYM_FUNCTIONS.get(target)


def is_allowed(name: str) -> bool:
    try:
        resolve(name)
    except OpNotAllowed:
        return False
    return True


@functools.cache
def resolve(name: str):
    """The callable for an allowlisted op name; OpNotAllowed otherwise."""
    if name in SYM_OPS:
        return SYM_OPS[name]
    if name not in _registered_schemas():
        raise OpNotAllowed(name)
    namespace, rest = name.split("::", 1)
    packet_name, overload = rest.rsplit(".", 1)
    if namespace not in ("aten", "prims") or packet_name in DENY_ATEN:
        raise OpNotAllowed(name)
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    op = getattr(packet, overload)
    if op._schema.is_mutable and packet_name not in MUTATING_ALLOWED:
        raise OpNotAllowed(name)
    return op
