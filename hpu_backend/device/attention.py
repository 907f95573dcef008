"""The device's attention: ``F.scaled_dot_product_attention`` (and Gaudi's ``FusedSDPA``) on device tensors as one
fused op, the kernel the CPU itself picks for the same inputs, forward and backward one node each, so that a
lazy graph or a compiled one holds the fused op Gaudi runs (placed on the device and fused by the lowering's
``fuse_attention``) rather than its decomposition. Where the CPU takes the math path (dropout, 3-d inputs,
grouped K/V heads), the device does too.
"""

from __future__ import annotations

import torch
import torch.fx.traceback as fx_traceback
from torch.nn.attention import SDPBackend

aten = torch.ops.aten


def device_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                     dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
                     enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of device tensors: the fused op where the CPU would run its fused
    kernel, else torch's math path (differentiable either way)."""
    # Grouped K/V heads take the math path: the fused CPU op here is called with as many K/V heads as Q's.
    grouped = enable_gqa and key.dim() >= 3 and key.shape[-3] != query.shape[-3]
    if not grouped and _cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) == _FLASH:
        return _FusedAttention.apply(query, key, value, _additive(attn_mask, query.dtype), dropout_p, is_causal,
                                     scale)
    return aten._scaled_dot_product_attention_math(query, key, value, _additive(attn_mask, query.dtype), dropout_p,
                                                   is_causal, scale=scale, enable_gqa=enable_gqa)[0]


def register(lib: torch.library.Library) -> None:
    """Make ``device_attention`` the device's ``scaled_dot_product_attention`` (``lib``: an ``aten`` IMPL library
    the caller keeps alive). At the autograd key, since torch decomposes the composite op there."""
    lib.impl("scaled_dot_product_attention", device_attention, "AutogradPrivateUse1")


_FLASH = SDPBackend.FLASH_ATTENTION.value


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: attend) as the additive mask the fused op and the math path take, as torch converts it
    before either (the math op adds the mask it is given to the scores)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))


def _cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) -> int:
    """The kernel torch picks on the CPU for inputs of these layouts (on uninitialized CPU twins: the choice
    reads shapes, strides, dtypes and requires_grad only)."""
    def twin(t):
        if t is None:
            return None
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu").requires_grad_(t.requires_grad)

    return torch._fused_sdp_choice(twin(query), twin(key), twin(value), twin(attn_mask), dropout_p, is_causal,
                                   scale=scale)


class _FusedAttention(torch.autograd.Function):
    """The fused attention op and its fused backward, with the CPU's own gradient formula (no mask gradient)."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale):
        out, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        ctx.save_for_backward(query, key, value, attn_mask, out, logsumexp)
        ctx.options = (dropout_p, is_causal, scale)
        ctx.annotations = dict(fx_traceback.current_meta.get("custom") or {})  # FusedSDPA's, for the backward
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, attn_mask, out, logsumexp = ctx.saved_tensors
        dropout_p, is_causal, scale = ctx.options
        with fx_traceback.annotate(ctx.annotations):
            grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return (*grads, None, None, None, None)
