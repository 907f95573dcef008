"""FusedSDPA: Gaudi's fused attention kernel under its name, computed by torch's scaled_dot_product_attention.

Gaudi scripts call ``habana_frameworks.torch.hpex.kernels.FusedSDPA.apply(q, k, v, attn_mask, dropout_p,
is_causal, scale, softmax_mode, recompute_mode, valid_sequence_lengths, padding_side)``. Here the
numerics are torch's ``scaled_dot_product_attention`` (forward and gradients). The recompute choice
is a property of the recipe, not of the numbers: the call is annotated
(``torch.fx.traceback.annotate``), the annotation follows the attention op into the forward and
backward graphs AOTAutograd makes, capture records it in ``facts["annotations"]`` (so it is part of
the recipe key), and the memory plan and cost estimate read it (``lowering/buffers.py``):
without recompute the B×H×S×L probabilities are saved for the backward, with it the backward
recomputes them (the forward's attention FLOPs again).

``recompute_mode=None`` takes the process-wide choice, as on Gaudi: the bridge's
``habana_frameworks.torch.hpu`` starts with recompute enabled (``sdp_kernel_flag.py``:
``is_recompute_FSDPA_enabled = True``, read by ``FusedSDPA`` through ``recompute_sdp_enabled()`` when
``recompute_mode`` is None; Intel Gaudi PyTorch bridge, github.com/HabanaAI/gaudi-pytorch-bridge), and
``enable_recompute_sdp(flag)`` / ``with sdp_kernel(enable_recompute=...)`` change it.

On the hpu device, torch would decompose ``F.scaled_dot_product_attention`` (a composite op: a device with
no C++ kernel choice gets the math path, its S×S scores and a ``_safe_softmax`` in the graph), where Gaudi runs
one fused kernel. ``device/attention.py`` is the device's kernel for it (registered with the device's other
kernels, at the dispatcher's AutogradPrivateUse1 key), and ``FusedSDPA.apply`` on device tensors calls it: the
fused op the CPU itself would pick for the same inputs (``_scaled_dot_product_flash_attention_for_cpu`` and its
backward, one node each in the recipe, placed on the device and fused by ``fuse_attention``), so the numbers
are the CPU's; where the CPU would take the math path (dropout, 3-d inputs) the device does too, and so do
grouped K/V heads (``enable_gqa``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx.traceback as fx_traceback
import torch.nn.functional as F

from ..device.attention import device_attention
from ..device.context import current_context
from ..lowering.buffers import FUSED_SDPA_ANNOTATION

aten = torch.ops.aten

SOFTMAX_MODES = ("None", "fast", "fp32")  # "fp32": softmax in fp32 for bf16 inputs (Optimum's Qwen2 passes it)

def enable_recompute_sdp(enabled: bool) -> None:
    """Whether ``FusedSDPA.apply(..., recompute_mode=None)`` recomputes (Gaudi's ``torch.hpu`` API); the device
    context holds the choice (recompute at its start, Gaudi's default: see the module docstring)."""
    current_context().recompute_sdp = bool(enabled)


def recompute_sdp_enabled() -> bool:
    return current_context().recompute_sdp


@contextlib.contextmanager
def sdp_kernel(enable_recompute: bool = True):
    """``with sdp_kernel(enable_recompute=False): ...`` sets the default for the block, as on Gaudi."""
    before = recompute_sdp_enabled()
    enable_recompute_sdp(enable_recompute)
    try:
        yield
    finally:
        enable_recompute_sdp(before)
PADDING_SIDES = ("left", "right", "None")  # "None": no padding (Optimum passes it without valid_sequence_lengths)


class FusedSDPA:
    """``FusedSDPA.apply(...)`` with Gaudi's signature and defaults (an autograd-aware call, as on Gaudi)."""

    @staticmethod
    def apply(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              softmax_mode: str = "None", recompute_mode: bool | None = None,
              valid_sequence_lengths: torch.Tensor | None = None, padding_side: str = "left") -> torch.Tensor:
        _check(query, key, value, attn_mask, dropout_p, is_causal, softmax_mode, recompute_mode,
               valid_sequence_lengths, padding_side)
        recompute = recompute_sdp_enabled() if recompute_mode is None else recompute_mode
        _check_kernel(query, key, value, recompute)
        key, value = _grouped(query, key), _grouped(query, value)
        keep = None
        if valid_sequence_lengths is not None:
            attn_mask, keep = _padding_mask(query, key, valid_sequence_lengths, is_causal, padding_side)
            is_causal = False
        attention = device_attention if query.device.type == "hpu" else F.scaled_dot_product_attention
        with fx_traceback.annotate({FUSED_SDPA_ANNOTATION: {"recompute": recompute}}):
            out = attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale)
        return out if keep is None else out * keep


def _check(query, key, value, attn_mask, dropout_p, is_causal, softmax_mode, recompute_mode,
           valid_sequence_lengths, padding_side) -> None:
    """One-line ValueErrors for what Gaudi refuses or what cannot be honoured here."""
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        raise TypeError("FusedSDPA.apply: query, key and value must be tensors")
    if softmax_mode not in SOFTMAX_MODES and softmax_mode is not None:
        raise ValueError(f"FusedSDPA.apply: softmax_mode={softmax_mode!r} is not one of {SOFTMAX_MODES}")
    if recompute_mode not in (None, True, False):
        raise ValueError(f"FusedSDPA.apply: recompute_mode={recompute_mode!r} must be True, False or None")
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"FusedSDPA.apply: padding_side={padding_side!r} is not one of {PADDING_SIDES}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"FusedSDPA.apply: dropout_p={dropout_p!r} must be in [0, 1)")
    if attn_mask is not None and is_causal:
        raise ValueError("FusedSDPA.apply: pass either attn_mask or is_causal=True, not both "
                         "(fold the causal mask into attn_mask)")
    if valid_sequence_lengths is not None:
        _check_lengths(query, attn_mask, valid_sequence_lengths)
        if padding_side == "None":
            raise ValueError("FusedSDPA.apply: valid_sequence_lengths needs padding_side='left' or 'right'")


def _check_kernel(query, key, value, recompute: bool) -> None:
    """What Gaudi's FusedSDPA kernel refuses that torch's scaled_dot_product_attention accepts (Intel Gaudi
    docs, hpex.kernels.FusedSDPA): fp16 inputs, and in recompute mode K/V of another batch size than Q's."""
    if any(t.dtype == torch.float16 for t in (query, key, value)):
        raise ValueError("FusedSDPA.apply: float16 inputs are not supported by Gaudi's FusedSDPA, which takes "
                         "bfloat16 or float32 (fp8 through fp8_fused_sdpa); cast q, k and v to bfloat16")
    if recompute and query.dim() >= 3 and {key.shape[0], value.shape[0]} != {query.shape[0]}:
        raise ValueError(f"FusedSDPA.apply: K/V batch size {key.shape[0]}/{value.shape[0]} differs from Q's "
                         f"{query.shape[0]}; Gaudi's FusedSDPA in recompute mode needs the same batch size in "
                         f"Q, K and V (expand K and V to Q's batch, or pass recompute_mode=False)")


def _grouped(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """K or V with fewer heads than Q (grouped-query attention, which Gaudi's kernel takes as is): each K/V
    head serves ``heads_q / heads_kv`` consecutive query heads, as ``enable_gqa``; repeated to Q's heads here."""
    if query.dim() != 4 or kv.dim() != 4 or kv.shape[1] == query.shape[1]:
        return kv
    if query.shape[1] % kv.shape[1]:
        raise ValueError(f"FusedSDPA.apply: {query.shape[1]} query heads are not a multiple of {kv.shape[1]} "
                         "key/value heads (grouped-query attention needs each K/V head to serve whole groups)")
    return kv.repeat_interleave(query.shape[1] // kv.shape[1], dim=1)


def _check_lengths(query, attn_mask, lengths) -> None:
    if attn_mask is not None:
        raise ValueError("FusedSDPA.apply: valid_sequence_lengths replaces attn_mask; pass one of them")
    if query.dim() != 4:
        raise ValueError(f"FusedSDPA.apply: valid_sequence_lengths needs [batch, heads, seq, dim] inputs, "
                         f"got a {query.dim()}-d query")
    if not isinstance(lengths, torch.Tensor) or lengths.shape != (query.shape[0],) or lengths.is_floating_point():
        raise ValueError(f"FusedSDPA.apply: valid_sequence_lengths must be an integer tensor of shape "
                         f"[{query.shape[0]}] (one length per batch row)")


def _padding_mask(query, key, lengths, is_causal: bool, padding_side: str):
    """(boolean attention mask [B,1,S,L], 0/1 factor [B,1,S,1] that zeroes padded query rows).

    Valid tokens are the first ``length`` positions (right padding) or the last (left padding).
    A padded query row has no key to attend to under a causal mask; it attends to every key (to
    stay finite) and its output is zeroed: padded positions carry no meaningful value on Gaudi either.
    """
    seq_q, seq_k = query.shape[-2], key.shape[-2]
    n = lengths.view(-1, 1)
    pos_q, pos_k = torch.arange(seq_q, device=query.device), torch.arange(seq_k, device=query.device)
    if padding_side == "right":
        valid_q, valid_k = pos_q < n, pos_k < n
    else:
        valid_q, valid_k = pos_q >= seq_q - n, pos_k >= seq_k - n
    allowed = valid_k[:, None, None, :]
    if is_causal:  # top-left aligned, as scaled_dot_product_attention's is_causal
        allowed = allowed & torch.ones(seq_q, seq_k, dtype=torch.bool, device=query.device).tril()
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    return allowed, valid_q[:, None, :, None].to(query.dtype)
