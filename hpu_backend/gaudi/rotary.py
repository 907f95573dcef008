"""Gaudi's rotary position embedding (``hpex.kernels``): the helpers Optimum Habana's LLaMA and ChatGLM paths call.

Intel's kernel is ``torch.ops.hpu.rotary_pos_embedding(input, sin, cos, position_ids, offset, mode)``: it
rotates ``input`` ([batch, heads, seq, dim]) by the angles whose cosines and sines it is given, the HF LLaMA
formula ``input * cos + rotate(input) * sin``, in the input's dtype. ``mode`` picks how ``rotate`` pairs the
channels: ``BLOCKWISE`` (0) pairs channel i with i + dim/2 (``rotate_half``, LLaMA's layout), ``PAIRWISE`` (1)
pairs 2i with 2i+1 (GPT-J's and Flux's interleaved layout). ``position_ids`` ([batch, seq]) gathers rows of
``cos``/``sin`` (given as [seq_max, dim] with any number of leading 1s); without them, rows ``offset ..
offset+seq`` are used. The backward is the transposed rotation: ``grad * cos - rotate(grad * sin)``.
"""

from __future__ import annotations

import enum

import torch


class RotaryPosEmbeddingMode(enum.Enum):
    BLOCKWISE = 0
    PAIRWISE = 1


def _rotate(x: torch.Tensor, mode: int) -> torch.Tensor:
    if mode == RotaryPosEmbeddingMode.PAIRWISE.value:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _angles(table: torch.Tensor, x: torch.Tensor, position_ids, offset: int) -> torch.Tensor:
    """``cos`` or ``sin`` as broadcast against ``x`` [batch, heads, seq, dim]: rows by position or by offset."""
    if position_ids is not None:
        rows = table.reshape(-1, table.shape[-1])[position_ids]  # [batch, seq, dim]
        return rows.unsqueeze(1) if x.dim() == 4 else rows
    seq = x.shape[-2]
    if table.shape[-2] != seq or offset:
        table = table.narrow(-2, offset, seq)
    return table


def _mode(mode) -> int:
    value = mode.value if isinstance(mode, RotaryPosEmbeddingMode) else int(mode)
    if value not in (0, 1):
        raise ValueError(f"rotary_pos_embedding: mode {mode!r} is not BLOCKWISE (0) or PAIRWISE (1)")
    return value


def rotary_pos_embedding(input: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, position_ids=None,
                         offset: int = 0, mode=0) -> torch.Tensor:
    """``torch.ops.hpu.rotary_pos_embedding``'s math (see the module docstring); argument order as Intel's."""
    mode = _mode(mode)
    cos, sin = _angles(cos, input, position_ids, offset), _angles(sin, input, position_ids, offset)
    return input * cos.to(input.dtype) + _rotate(input, mode) * sin.to(input.dtype)


def rotary_pos_embedding_backward(grad: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, position_ids=None,
                                  offset: int = 0, mode=0) -> torch.Tensor:
    """The gradient of ``rotary_pos_embedding`` with respect to its input (the transposed rotation)."""
    mode = _mode(mode)
    cos, sin = _angles(cos, grad, position_ids, offset), _angles(sin, grad, position_ids, offset)
    return grad * cos.to(grad.dtype) - _rotate(grad * sin.to(grad.dtype), mode)


class RotaryPosEmbeddingHelperV1(torch.autograd.Function):
    """``RotaryPosEmbeddingHelperV1.apply(p, cos, sin, offset=0)``: rows from ``offset``, blockwise."""

    @staticmethod
    def forward(ctx, p, cos, sin, offset=0):
        ctx.save_for_backward(cos, sin)
        ctx.rope = (None, offset, 0)
        return rotary_pos_embedding(p, sin, cos, None, offset, 0)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        position_ids, offset, mode = ctx.rope
        return rotary_pos_embedding_backward(grad, sin, cos, position_ids, offset, mode), None, None, None


class RotaryPosEmbeddingHelperV2(torch.autograd.Function):
    """``RotaryPosEmbeddingHelperV2.apply(p, cos, sin, position_ids=None, offset=0, mode=BLOCKWISE)``."""

    @staticmethod
    def forward(ctx, p, cos, sin, position_ids=None, offset=0, mode=RotaryPosEmbeddingMode.BLOCKWISE):
        ctx.save_for_backward(cos, sin)
        ctx.rope = (position_ids, offset, _mode(mode))
        return rotary_pos_embedding(p, sin, cos, position_ids, offset, mode)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        position_ids, offset, mode = ctx.rope
        return rotary_pos_embedding_backward(grad, sin, cos, position_ids, offset, mode), None, None, None, None, None


class RotaryPosEmbeddingHelperV3:
    """``RotaryPosEmbeddingHelperV3.apply(x, rope_cache)``: ChatGLM's rotary embedding. ``x`` is [seq, batch,
    heads, dim]; ``rope_cache`` [seq, batch or 1, rot_dim/2, 2] holds (cos, sin) per channel pair; the first
    ``rot_dim`` channels rotate pairwise, the others pass through. Differentiable through torch's autograd."""

    @staticmethod
    def apply(x: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
        seq, heads = x.shape[0], x.shape[2]
        rot_dim = rope_cache.shape[-2] * 2
        rotated, passed = x[..., :rot_dim], x[..., rot_dim:]
        pairs = rotated.reshape(seq, -1, heads, rot_dim // 2, 2)
        cache = rope_cache[:seq].view(seq, -1, 1, rot_dim // 2, 2)
        cos, sin = cache[..., 0], cache[..., 1]
        out = torch.stack((pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin), -1)
        return torch.cat((out.flatten(3), passed), dim=-1)


def apply_rotary_pos_emb(p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids=None, offset: int = 0,
                         mode=RotaryPosEmbeddingMode.BLOCKWISE) -> torch.Tensor:
    """``hpex.kernels.apply_rotary_pos_emb``: ``RotaryPosEmbeddingHelperV2`` as a function."""
    return RotaryPosEmbeddingHelperV2.apply(p, cos, sin, position_ids, offset, mode)
