"""The HPU op support table: which aten ops run on which engine, for which dtypes (else: CPU fallback).

The table is plain immutable data built by ``default_table()`` (a fresh table per call, so tests
can build and vary their own with ``OpTable.replace`` / ``OpTable.without``). A record's
``capable`` check answers yes or no for any input and never raises. Ops are keyed by their aten
packet name (``add`` for ``aten::add.Tensor``): support on the device is per op, not per overload.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

FLOAT = frozenset({"float32", "bfloat16", "float16"})
FP8 = frozenset({"float8_e4m3fn", "float8_e5m2"})
INT = frozenset({"int8", "int16", "int32", "int64", "uint8"})
BOOL = frozenset({"bool"})
ALL = FLOAT | INT | BOOL

ENGINES = ("mme", "tpc", "dma", "net", "view", "host")  # net: the integrated RoCE ports (collectives)

# Kinds that the fusion pass may put into one TPC kernel.
FUSIBLE_KINDS = frozenset({"elementwise", "reduction", "softmax"})

# Host scalar ops: symbolic-int arithmetic, size queries and metadata checks the bridge evaluates while launching
# a recipe (``_assert_tensor_metadata``: a dtype/device check the tracer leaves, no data read). They are neither
# device kernels nor CPU fallbacks.
HOST_NAMESPACES = ("operator::", "math::", "torch::", "builtins::")
HOST_ATEN = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_assert_tensor_metadata"})


@dataclass(frozen=True)
class OpSupport:
    """One supported op: its engine, its kind (for fusion and cost) and its dtypes."""

    op: str  # aten packet name
    engine: str  # one of ENGINES
    kind: str  # matmul | conv | attention | elementwise | reduction | softmax | norm | index | ...
    dtypes: frozenset

    def capable(self, dtypes: Iterable[str]) -> bool:
        """True if every dtype is supported; False for anything else, including malformed input."""
        if isinstance(dtypes, str):
            return False
        try:
            return all(isinstance(d, str) and d in self.dtypes for d in dtypes)
        except TypeError:
            return False


class OpTable:
    """An immutable map from aten packet name to its OpSupport record."""

    def __init__(self, records: Iterable[OpSupport]):
        self.records: Mapping[str, OpSupport] = MappingProxyType({r.op: r for r in records})

    @functools.cached_property
    def digest(self) -> str:
        """A short hash of every record: a recipe placed by another table is another recipe (its key says so)."""
        rows = sorted((r.op, r.engine, r.kind, sorted(r.dtypes)) for r in self.records.values())
        return hashlib.blake2b(repr(rows).encode(), digest_size=8).hexdigest()

    def lookup(self, op_name: str) -> OpSupport | None:
        """The record for a recipe op name (``aten::add.Tensor``) or packet name (``add``). The table
        describes ATen ops and the functional collectives: a library's op that shares an ATen name
        (``mylib::relu``) has no record."""
        if "::" in op_name and not op_name.startswith(TABLE_NAMESPACES):
            return None
        return self.records.get(packet_name(op_name))

    def capable(self, op_name: str, dtypes: Iterable[str]) -> bool:
        record = self.lookup(op_name) if isinstance(op_name, str) else None
        return record is not None and record.capable(dtypes)

    def replace(self, op: str, **changes) -> "OpTable":
        """A new table with one record added or changed (``dtypes=...``, ``engine=...``)."""
        old = self.records.get(op) or OpSupport(op, "tpc", "elementwise", FLOAT)
        return OpTable([*(r for k, r in self.records.items() if k != op), dataclasses.replace(old, **changes)])

    def without(self, *ops: str) -> "OpTable":
        return OpTable(r for k, r in self.records.items() if k not in ops)

    def __len__(self) -> int:
        return len(self.records)


TABLE_NAMESPACES = ("aten::", "prims::", "_c10d_functional::")  # the namespaces the table describes


def packet_name(op_name: str) -> str:
    """``aten::add.Tensor`` → ``add``; a bare packet name is returned unchanged."""
    rest = op_name.split("::", 1)[1] if "::" in op_name else op_name
    return rest.split(".", 1)[0]


def is_host_op(op_name: str) -> bool:
    return op_name.startswith(HOST_NAMESPACES) or (
        op_name.startswith("aten::") and packet_name(op_name) in HOST_ATEN)


def is_library_op(op_name: str) -> bool:
    """A library's custom op (``transformers::grouped_mm_fallback.default``), registered through torch.library:
    the device has no kernel for it, so it runs on the CPU, as the bridge runs an op it does not know."""
    return "::" in op_name and not op_name.startswith(TABLE_NAMESPACES) and not is_host_op(op_name)


def qualified_name(op_name: str) -> str:
    """``aten::add.Tensor`` → ``aten::add``; ``mylib::relu.default`` → ``mylib::relu`` (a bare packet: aten)."""
    namespace = op_name.split("::", 1)[0] if "::" in op_name else "aten"
    return f"{namespace}::{packet_name(op_name)}"


@functools.cache
def shared_table() -> OpTable:
    """The default table, built once per process (safe to share: tables are immutable)."""
    return default_table()


def _group(engine: str, kind: str, dtypes: frozenset, names: str) -> list[OpSupport]:
    return [OpSupport(n, engine, kind, dtypes) for n in names.split()]


def default_table() -> OpTable:
    """The device's op support, as documented for the Gaudi PyTorch bridge (a fresh table): Intel's "PyTorch
    Operators" support summary (docs.habana.ai, Pytorch_Operators), by the aten ops the listed torch functions
    reach (``torch.stack`` → ``stack``, ``F.mse_loss`` → ``mse_loss`` and its backward, ``torch.unique`` →
    ``_unique2``), plus what autograd and tensor creation issue on the device (``select_backward``, ``zero_``,
    ``lift_fresh``)."""
    return OpTable([
        *_group("mme", "matmul", FLOAT | FP8, "mm bmm addmm baddbmm addbmm addmv"),
        *_group("mme", "conv", FLOAT, "convolution convolution_backward"),
        *_group("mme", "attention", FLOAT, "_scaled_dot_product_flash_attention_for_cpu "
                "_scaled_dot_product_flash_attention_for_cpu_backward"),
        *_group("tpc", "elementwise", ALL, ELEMENTWISE_ANY),
        *_group("tpc", "elementwise", FLOAT, ELEMENTWISE_FLOAT),
        # Special functions: TPC kernels exist in FP32 only; BF16/FP16 fall back to the CPU.
        *_group("tpc", "elementwise", frozenset({"float32"}), "digamma lgamma polygamma erfinv"),
        *_group("tpc", "elementwise", ALL | FP8, "_to_copy to convert_element_type"),
        *_group("tpc", "reduction", FLOAT | INT | BOOL, REDUCTIONS),
        # Multi-tensor kernels of the optimizers and gradient clipping (Gaudi's fused optimizers).
        *_group("tpc", "foreach", FLOAT, FOREACH),
        *_group("tpc", "softmax", FLOAT, "_softmax _log_softmax _softmax_backward_data "
                "_log_softmax_backward_data _safe_softmax"),
        *_group("tpc", "loss", FLOAT, LOSSES),
        *_group("tpc", "norm", FLOAT | {"uint8"}, NORMS),  # uint8: batch norm's reserve buffer
        *_group("tpc", "index", FLOAT | INT | BOOL, INDEXING),
        *_group("tpc", "random", FLOAT | INT | BOOL, RANDOM),
        *_group("tpc", "factory", ALL, FACTORIES),
        *_group("dma", "layout", ALL | FP8, LAYOUT_COPIES),
        *_group("dma", "sync", ALL, "_local_scalar_dense"),
        *_group("view", "view", ALL | FP8, VIEWS),
        # Functional collectives run on the network engines; wait_tensor returns its input once it is complete.
        *_group("net", "collective", ALL | FP8, COLLECTIVES),
        *_group("view", "wait", ALL | FP8, "wait_tensor"),
    ])


ELEMENTWISE_ANY = """
add sub rsub mul div neg abs sign where clamp clamp_min clamp_max maximum minimum eq ne lt le gt ge
logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor bitwise_not
remainder fmod masked_fill relu threshold threshold_backward hardtanh isnan isinf isfinite
ceil floor round trunc square pow copysign fmax fmin signbit native_dropout_backward
"""
ELEMENTWISE_FLOAT = """
exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan atan2
sinh cosh tanh asinh acosh atanh erf erfc sigmoid sigmoid_backward tanh_backward gelu
gelu_backward silu silu_backward elu elu_backward leaky_relu leaky_relu_backward hardsigmoid
hardswish hardsigmoid_backward hardswish_backward softplus softplus_backward mish lerp addcmul
addcdiv nan_to_num logit xlogy frac hypot logaddexp hardtanh_backward relu6 sgn angle nextafter
i0 special_i0e special_i1 special_i1e special_erfcx special_ndtri special_xlog1py special_entr igamma
igammac _pdist_forward _cdist_forward cdist dist _trilinear _pdist_backward _cdist_backward ldexp
rrelu_with_noise_backward
"""
REDUCTIONS = """
sum mean amax amin max min argmax argmin prod var var_mean std any all cumsum cumprod logsumexp
linalg_vector_norm norm sort topk median nanmedian mode kthvalue logcumsumexp cummax cummin aminmax
histc searchsorted bucketize nansum
"""
NORMS = """
native_layer_norm native_layer_norm_backward native_batch_norm native_batch_norm_backward
_native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
native_group_norm native_group_norm_backward _batch_norm_with_update _batch_norm_with_update_functional
_batch_norm_no_update batch_norm_backward _weight_norm_interface _weight_norm_interface_backward
"""
INDEXING = """
embedding embedding_dense_backward index index_select index_put _unsafe_index _unsafe_index_put
gather scatter scatter_add scatter_reduce masked_scatter nll_loss_forward nll_loss_backward
max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward
_adaptive_avg_pool2d _adaptive_avg_pool2d_backward upsample_nearest2d upsample_bilinear2d
nonzero nonzero_static flip roll tril triu index_reduce index_add index_copy index_fill masked_select
take put segment_reduce grid_sampler_2d grid_sampler_3d adaptive_max_pool2d adaptive_max_pool3d
max_pool3d_with_indices avg_pool3d _adaptive_avg_pool3d upsample_nearest1d upsample_linear1d
upsample_bicubic2d upsample_nearest3d upsample_trilinear3d _upsample_bilinear2d_aa reflection_pad1d
reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d _embedding_bag
_embedding_bag_forward_only col2im im2col pixel_shuffle pixel_unshuffle fractional_max_pool2d fractional_max_pool3d
adaptive_max_pool2d_backward adaptive_max_pool3d_backward _adaptive_avg_pool3d_backward avg_pool3d_backward
max_pool3d_with_indices_backward grid_sampler_2d_backward grid_sampler_3d_backward replication_pad1d_backward
replication_pad2d_backward replication_pad3d_backward reflection_pad1d_backward reflection_pad2d_backward
reflection_pad3d_backward _upsample_bilinear2d_aa_backward fractional_max_pool2d_backward
fractional_max_pool3d_backward _unique2 unique_dim unique_consecutive _unique
"""
FOREACH = """
_foreach_add _foreach_sub _foreach_mul _foreach_div _foreach_addcmul _foreach_addcdiv _foreach_sqrt
_foreach_rsqrt _foreach_norm _foreach_pow _foreach_lerp _foreach_neg _foreach_maximum _foreach_minimum
_foreach_clamp_min _foreach_clamp_max _foreach_reciprocal _foreach_sign _foreach_abs _foreach_exp
_foreach_copy _foreach_zero
"""
LOSSES = """
mse_loss mse_loss_backward smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward l1_loss
binary_cross_entropy binary_cross_entropy_backward binary_cross_entropy_with_logits
"""
COLLECTIVES = "all_reduce all_gather_into_tensor reduce_scatter_tensor all_to_all_single"
RANDOM = """rand randn rand_like randn_like randint randint_like bernoulli native_dropout uniform normal
rrelu_with_noise_functional multinomial"""
FACTORIES = """
full full_like zeros zeros_like ones ones_like new_zeros new_ones new_full scalar_tensor arange fill
empty empty_like empty_strided empty_permuted new_empty new_empty_strided _efficientzerotensor zero
"""
LAYOUT_COPIES = """
clone copy copy_ contiguous cat repeat constant_pad_nd lift_fresh_copy slice_scatter
select_scatter diagonal_scatter as_strided_scatter view_copy permute_copy narrow_copy unbind_copy
as_strided_copy expand_copy t_copy transpose_copy unsqueeze_copy squeeze_copy select_copy slice_copy
split_copy split_with_sizes_copy diagonal_copy alias_copy detach_copy unfold_copy stack
select_backward slice_backward
"""
VIEWS = """
view _unsafe_view reshape alias permute t transpose expand squeeze unsqueeze slice select
split_with_sizes split unbind as_strided diagonal narrow unflatten flatten detach movedim chunk
tensor_split unfold lift_fresh
"""
