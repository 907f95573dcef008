"""The runtime's op allowlist: the only way an op name in a recipe becomes a callable.

A name resolves when it is a registered ATen or prims schema, or a library's custom op (a
``torch.library`` op in a namespace of its own) that the running process has registered — asked of
the dispatcher before any attribute lookup, so a name never imports anything and an op the process
has not registered is refused. Torch's own other namespaces (``TORCH_NAMESPACES``: profiler,
distributed, quantized, ... ops) are refused. The op must be functional (it mutates nothing, except the input writes in
``MUTATING_ALLOWED``), it returns a value (an op run only for its effect, such as ``aten::save``,
``aten::_print`` or ``aten::manual_seed``, is refused unless it is a check in ``EFFECT_ALLOWED``),
it takes no file name, and it is not in ``DENY_ATEN`` (ops that touch files or process state, or write
an argument their schema does not mark as written); symbolic-int arithmetic resolves from the fixed
``SYM_OPS`` table (products, sums, powers and repetitions bounded); the functional collectives of
``runtime.collectives`` (``_c10d_functional``) resolve too, their groups checked when a recipe is built. Anything else
is an
``OpNotAllowed`` error at recipe load time.
"""

from __future__ import annotations

import functools
import math
import operator

import torch

from ..formats.symexpr import bounded_add, bounded_mod, bounded_mul, bounded_pow, bounded_sub
from . import collectives
from ..errors import HpuBackendError


class OpNotAllowed(HpuBackendError, KeyError):
    """A recipe names an op outside the allowlist (raised by ``resolve``)."""

    def __str__(self) -> str:
        return f"op {self.args[0]!r} is not in the hpu_backend runtime allowlist"


# In-place ops that functional graphs still contain (input mutations kept in the graph).
MUTATING_ALLOWED = frozenset({"copy_"})

# Ops that read or write files or process state: never allowed, whatever their tags say.
DENY_ATEN = frozenset({"from_file", "_copy_from", "_copy_from_and_resize", "_debug_has_internal_overlap", "set_",
                       "_set_grad_enabled",
                       "set_grad_enabled", "manual_seed", "seed", "_print", "save", "warn", "backward",
                       "_backward", "dist_backward"}) | frozenset({
    # Internal CPU kernels that trust their callers' shapes (torch 2.13 crashes the process, with a segmentation
    # fault or a division by zero, on arguments a stored recipe can carry); no graph this backend lowers holds them.
    "_thnn_differentiable_gru_cell_backward", "_thnn_differentiable_lstm_cell_backward", "_dyn_quant_matmul_4bit",
    "_dyn_quant_pack_4bit_weight", "_transform_bias_rescale_qkv", "_cholesky_solve_helper"})
# Families of backend-specific internal kernels (NNPACK, THNN, MKL-DNN, FBGEMM, cuDNN/MIOpen, packed int4/int8
# weights, dynamic quantization): the same trust in their callers, and never in a graph lowered for Gaudi.
DENY_PREFIXES = ("_nnpack_", "_thnn_", "_dyn_quant_", "mkldnn_", "_mkldnn_", "fbgemm_", "_fbgemm_", "cudnn_",
                 "_cudnn_", "miopen_", "_weight_int4pack", "_weight_int8pack", "_convert_weight_to_int4pack")

# Argument types whose values a recipe stores tagged ({"dtype": "float32"}); a bare number there is an enum
# index the kernels do not check (a dtype of -1 crashes the process), so it is refused at load.
ENUM_TYPES = frozenset({"ScalarType", "Layout", "MemoryFormat"})
# Literal arguments a kernel needs and does not check: (op, position, name) -> the only value it accepts.
# _native_batch_norm_legit.no_stats has no running statistics to read, so it must be in training mode.
REQUIRED_LITERALS = {("aten::_native_batch_norm_legit.no_stats", 3, "training"): True}

# Ops with no result that graphs legitimately contain: shape and value checks.
EFFECT_ALLOWED = frozenset({"_assert_async", "_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range",
                            "sym_constrain_range_for_size", "_linalg_check_errors", "_sink_tokens"})

# Namespaces torch itself registers besides aten and prims: process, profiler, distributed, quantized and
# internal ops, never a library's custom op. Any other registered namespace is a library's (torch.library).
TORCH_NAMESPACES = frozenset({
    "prim", "quantized", "_quantized", "quantization", "symm_mem", "static_runtime", "c10d", "_c10d_functional",
    "_c10d_functional_autograd", "onednn", "mkldnn", "mkldnn_prepacked", "mkl", "profiler", "sparse", "inductor",
    "inductor_prims", "_test", "onnx", "debugprims", "_dtensor", "rngprims", "_native", "export", "debug_mode_ops",
    "higher_order", "fsdp", "_inductor_test", "streams", "_quantized_decomposed", "quantized_decomposed"})

_FILE_ARGS = frozenset({"filename", "file", "path", "f"})

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
# What runs for a name when it differs from the FX target it names: every operation whose result can outgrow
# its operands is bounded before it computes (integers past MAX_BITS bits, a list or string repeated or joined
# past MAX_ITEMS items, a string formatted by %): a stored recipe must not ask for unbounded work or memory.
SYM_RUNTIME = {**SYM_OPS, "operator::pow": bounded_pow, "operator::mul": bounded_mul, "operator::add": bounded_add,
               "operator::sub": bounded_sub, "operator::mod": bounded_mod}


def _registered(namespace_packet: str, overload: str) -> bool:
    """Whether the dispatcher has this schema (asked before any attribute lookup by name)."""
    try:
        torch._C._get_schema(namespace_packet, "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True


def op_name(target) -> str | None:
    """The recipe name of an FX call target, or None if it has no recipe name."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}::{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    return SYM_FUNCTIONS.get(target)


def check_arguments(name: str, op, args: list, kwargs: dict) -> None:
    """ValueError when a node's literal arguments are ones its kernel trusts blindly: a bare
    number where the schema takes a dtype, layout or memory format, or a literal in ``REQUIRED_LITERALS``
    with another value. ``op``: what ``resolve(name)`` returned."""
    if not isinstance(op, torch._ops.OpOverload):
        return
    for i, a in enumerate(op._schema.arguments):
        given = kwargs.get(a.name, args[i] if i < len(args) and not a.kwarg_only else None)
        kind = str(a.real_type).removeprefix("Optional[").rstrip("]")  # the enum behind an int-typed argument
        if kind in ENUM_TYPES and given is not None and not (isinstance(given, dict) and len(given) == 1):
            raise ValueError(f"{name}: argument {a.name} ({kind}) must be stored tagged, not as {given!r:.40}")
        required = REQUIRED_LITERALS.get((name, i, a.name))
        if required is not None and given != required:
            raise ValueError(f"{name}: argument {a.name} must be {required!r} (its kernel does not check it)")


def is_allowed(name: str) -> bool:
    try:
        resolve(name)
    except OpNotAllowed:
        return False
    return True


# Generated Python bindings of ATen (the ones eager PyTorch calls). They take the same positional
# arguments and keyword-only names as the schema and pick the overload by argument types, which is
# the overload the recipe recorded; calling them skips OpOverload's generic argument conversion.
_BINDINGS = (torch._C._VariableFunctions, torch._C._nn)
_TENSOR_METHODS = frozenset({"view", "expand"})


# Argument types the generated bindings parse differently from the schema: a binding refuses
# ``None`` in an index list (``x[:, idx]`` is ``index(x, [None, idx])``), the dispatcher does not.
_SCHEMA_ONLY_TYPES = frozenset({"List[Optional[Tensor]]"})
# Arguments whose default the generated bindings read differently from the schema: the losses' ``int
# reduction=Mean`` is 1 (mean) in the schema and 0 (none) in the bindings, so a recorded call that leaves it
# out (the lazy recorder's ``mse_loss(a, b)``) would reduce nothing through a binding.
_SCHEMA_ONLY_DEFAULTS = frozenset({"reduction"})


def standard_callable(name: str):
    """The op as the dispatcher runs it (OpOverload's own entry): what a failed fast path falls back to."""
    op = resolve(name)
    return op._op if isinstance(op, torch._ops.OpOverload) else op


@functools.cache
def fast_callable(name: str):
    """The quickest callable for an allowlisted op: its generated binding if it has one."""
    op = resolve(name)
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return standard_callable(name)
    if any(str(a.type) in _SCHEMA_ONLY_TYPES or (a.name in _SCHEMA_ONLY_DEFAULTS and a.has_default_value())
           for a in op._schema.arguments):
        return op._op
    packet = op._schema.name.split("::", 1)[1]
    if packet in _TENSOR_METHODS and op._overloadname == "default":
        return getattr(torch.Tensor, packet)
    for module in _BINDINGS:
        binding = getattr(module, packet, None)
        if binding is not None:
            return binding
    return op._op  # the dispatcher entry itself, still one Python frame less than OpOverload


@functools.cache
def resolve(name: str):
    """The callable for an allowlisted op name; OpNotAllowed otherwise."""
    if name in SYM_RUNTIME:
        return SYM_RUNTIME[name]
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.rpartition(".")
    collective = namespace == collectives.NAMESPACE and packet_name in collectives.OPS
    if (not namespace.isidentifier() or (namespace in TORCH_NAMESPACES and not collective)
            or packet_name in DENY_ATEN or packet_name.startswith(DENY_PREFIXES) or not packet_name
            or not _registered(f"{namespace}::{packet_name}", overload)):
        raise OpNotAllowed(name)
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    op = getattr(packet, overload)
    if not isinstance(op, torch._ops.OpOverload):
        raise OpNotAllowed(name)
    schema = op._schema
    if schema.is_mutable and packet_name not in MUTATING_ALLOWED:
        raise OpNotAllowed(name)
    if not schema.returns and packet_name not in EFFECT_ALLOWED:
        raise OpNotAllowed(name)
    if any(a.name in _FILE_ARGS for a in schema.arguments):
        raise OpNotAllowed(name)
    return op
