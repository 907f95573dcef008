"""The decomposition table for the HPU op set: core ATen, minus the ops Gaudi runs as whole kernels.

AOTAutograd decomposes every op in this table while tracing. Ops in ``HPU_NATIVE`` are left whole
because the device has a kernel for them (TPC: silu, softmax and loss backward, normalization;
MME: baddbmm; FusedSDPA for attention), which also keeps their numerics identical to eager.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten

HPU_NATIVE = frozenset({
    aten.silu, aten.silu_backward, aten.gelu_backward, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm_backward, aten.native_batch_norm_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.native_dropout_backward,
    aten.embedding_dense_backward, aten.baddbmm, aten._scaled_dot_product_flash_attention_for_cpu,
})


@functools.cache
def hpu_decompositions() -> dict:
    """The table passed to AOTAutograd (built once; callers must not mutate it)."""
    return {op: fn for op, fn in core_aten_decompositions().items()
            if op.overloadpacket not in HPU_NATIVE}
