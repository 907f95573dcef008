"""The runtime's op allowlist: the only way an op name in a recipe becomes a callable.

A name resolves when it is a registered ATen or prims schema (checked against the dispatcher's
own schema list before any attribute lookup) and the op is core ATen, pointwise, a prim, or in
``EXTRA_ATEN``; symbolic-int arithmetic resolves from the fixed ``SYM_OPS`` table. Anything else
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


# Non-core ATen ops that the HPU op set keeps whole (see hpu_backend/decompositions.py) or that
# functional graphs use. Names are packet names; every overload of them is allowed.
EXTRA_ATEN = frozenset({
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "copy_", "_unsafe_view",
    "t", "view", "alias", "lift_fresh_copy", "detach", "_to_copy", "clone", "expand", "slice",
    "silu", "silu_backward", "gelu_backward", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm_backward", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "nll_loss_forward", "nll_loss_backward", "native_dropout", "native_dropout_backward",
    "embedding_dense_backward", "baddbmm", "mm", "bmm", "addmm", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "convolution_backward", "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward", "avg_pool2d_backward", "threshold_backward", "rand", "randn",
    "bernoulli", "rand_like", "randn_like", "randint", "randint_like", "scalar_tensor", "linalg_vector_norm",
    "_local_scalar_dense", "zeros", "ones", "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones",
    "new_empty", "new_full", "copy", "masked_fill", "index_put", "_unsafe_index", "_unsafe_index_put",
    "unbind", "split_with_sizes", "split", "chunk", "tensor_split", "reshape", "unsqueeze", "squeeze",
    "flatten", "unflatten", "diagonal", "narrow", "movedim", "to", "contiguous", "empty_strided",
})

# Ops that read or write files or process state: never allowed, whatever their tags say.
DENY_ATEN = frozenset({"from_file", "_debug_has_internal_overlap", "set_", "_set_grad_enabled"})

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
}

SYM_FUNCTIONS = {fn: name for name, fn in SYM_OPS.items()}


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
    tags = op.tags
    if namespace == "aten" and not (
        packet_name in EXTRA_ATEN or torch.Tag.core in tags or torch.Tag.pointwise in tags
    ):
        raise OpNotAllowed(name)
    return op
