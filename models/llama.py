"""A LLaMA-architecture decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention, KV cache),
torch only: a model file with a prefill step (this file) and a decode step (``DECODE``).

The prefill step reads ``input_len`` tokens and returns the last position's logits and every layer's
keys and values; the decode step reads one token per sequence and a KV cache of ``kv_len`` tokens
and returns the logits and the new token's keys and values. ``LLAMA2_7B`` and ``LLAMA2_70B`` have
LLaMA 2's shapes (Touvron et al. 2023, "Llama 2", Table 1 and the released config.json files);
``LLAMA31_8B``, ``LLAMA31_70B`` and ``LLAMA31_405B`` LLaMA 3.1's (Llama Team 2024, "The Llama 3 Herd of
Models", Table 3, and the released config.json files; LLaMA 3.1's rope scaling for long contexts is left
out: it changes no shape or cost). ``TINY`` is for tests; ``TINY_TP`` (``models/llama.py:TINY_TP``) is as tiny
with 8 heads and an MLP that splits over 1, 2, 4 or 8 cards (``hpurecipe warm models/llama.py:TINY_TP --cards 8``).
The file's own names are the tiny model; ``models/llama.py:LLAMA2_7B`` selects the 7B one (built on
the meta device by ``hpurecipe analyze --input-len ... --output-len ...``: no weight is allocated).

Tensor parallelism: attention works on however many heads its projections give it, so the model runs
sharded by ``parallelize_module`` (q, k, v, gate, up column-wise; o, down row-wise). ``PER_CARD(cards, group,
layers)`` is the model file of one card's shard for capacity planning: its heads, KV heads, MLP and vocabulary
split over the cards, an all-reduce after attention and after the MLP, the logits gathered.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.fx.traceback as fx_traceback
import torch.nn.functional as F

from hpu_backend.modelfiles.modelspec import generative_steps


@dataclass(frozen=True)
class Config:
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    max_seq: int = 4096
    rope_theta: float = 10000.0
    eps: float = 1e-5
    head_size: int = 0  # 0: dim // heads (a shard keeps the full model's head size)
    tp: int = 1  # cards the layers are split over (a shard's all-reduces span them)
    group: str = ""  # the process group of those cards

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.heads


CONFIG_7B = Config(vocab=32000, dim=4096, layers=32, heads=32, kv_heads=32, hidden=11008)
CONFIG_2_70B = Config(vocab=32000, dim=8192, layers=80, heads=64, kv_heads=8, hidden=28672)
CONFIG_31_8B = Config(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336, max_seq=131072,
                      rope_theta=500000.0)
CONFIG_31_70B = Config(vocab=128256, dim=8192, layers=80, heads=64, kv_heads=8, hidden=28672, max_seq=131072,
                       rope_theta=500000.0)
CONFIG_31_405B = Config(vocab=128256, dim=16384, layers=126, heads=128, kv_heads=8, hidden=53248, max_seq=131072,
                        rope_theta=500000.0)
CONFIG_TINY = Config(vocab=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=172, max_seq=512)
CONFIG_TINY_TP = Config(vocab=256, dim=64, layers=2, heads=8, kv_heads=2, hidden=176, max_seq=512)  # up to 8 cards


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalize in float32 as LLaMA's reference code does, then return to the activations' dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x, cos, sin):
    """Rotary embedding in the half-split layout (HF LLaMA's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def per_card(c: Config, cards: int, group: str, layers: int | None = None) -> Config:
    """One card's shard of ``c`` over ``cards`` (tensor parallel; ``layers``: fewer layers, to extrapolate)."""
    if c.heads % cards or c.hidden % cards or c.vocab % cards or (c.kv_heads % cards and cards % c.kv_heads):
        raise ValueError(f"{c.heads} heads, {c.kv_heads} KV heads, MLP {c.hidden} and vocabulary {c.vocab} "
                         f"do not split over {cards} cards")
    return dataclasses.replace(c, heads=c.heads // cards, kv_heads=max(1, c.kv_heads // cards),
                               hidden=c.hidden // cards, head_size=c.head_dim, tp=cards, group=group,
                               layers=layers or c.layers)


def all_reduce(x, c: Config):
    """The sum of every card's partial ``x`` (the row-parallel layers' outputs); ``x`` on one card."""
    if c.tp == 1:
        return x
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", c.group))


def all_gather_last(x, c: Config):
    """Every card's slice of the last dimension (a column-parallel output), concatenated."""
    if c.tp == 1:
        return x
    parts = torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), c.tp, c.group))
    return parts.view(c.tp, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], c.tp * x.shape[-1])


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.q = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)

    def forward(self, x, cos, sin, past=None):
        """Attention over ``past`` (cached keys, values) and ``x``; returns (output, new keys, new values)."""
        b, s, _ = x.shape  # head counts follow the projections (a tensor-parallel shard has fewer)
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if past is None:
            y = F.scaled_dot_product_attention(q, self._repeat(k), self._repeat(v), is_causal=True)
        else:
            y = self._decode(q, k, v, *past)
        return all_reduce(self.o(y.transpose(1, 2).reshape(b, s, -1)), self.config), k, v

    def _decode(self, q, k, v, past_k, past_v):
        """One new token's attention over the cache and itself, without copying the cache (a server writes
        the new key and value into a preallocated cache in place; a concatenation would read and write it
        all once more per step). The query heads sharing a key/value head form that head's query rows.
        A Gaudi server runs this as one fused attention kernel (FusedSDPA over the cache): the annotation
        tells the lowering so, as ``FusedSDPA.apply`` does, so that its scores are planned on chip."""
        b, heads, kvh, hd = q.shape[0], q.shape[1], k.shape[1], self.head_dim
        with fx_traceback.annotate({"hpu_fused_sdpa": {"recompute": False}}):
            qg = q.reshape(b, kvh, heads // kvh, hd) / math.sqrt(hd)
            scores = torch.cat((qg @ past_k.transpose(2, 3), (qg * k).sum(-1, keepdim=True)), dim=-1)
            p = scores.float().softmax(-1).to(q.dtype)
            y = p[..., :-1] @ past_v + p[..., -1:] * v
        return y.reshape(b, heads, 1, hd)

    def _repeat(self, t):
        """Grouped-query attention: each key/value head serves heads // kv_heads query heads."""
        n = self.heads // self.kv_heads  # the same ratio on every shard
        if n == 1:
            return t
        b, h, s, d = t.shape
        return t[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.attn_norm, self.mlp_norm = RMSNorm(c.dim, c.eps), RMSNorm(c.dim, c.eps)
        self.attn = Attention(c)
        self.gate = nn.Linear(c.dim, c.hidden, bias=False)
        self.up = nn.Linear(c.dim, c.hidden, bias=False)
        self.down = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x, cos, sin, past=None):
        a, k, v = self.attn(self.attn_norm(x), cos, sin, past)
        x = x + a
        h = self.mlp_norm(x)
        return x + all_reduce(self.down(F.silu(self.gate(h)) * self.up(h)), self.config), k, v


class Llama(nn.Module):
    """``forward(tokens, *cache)``: prefill without a cache, one decode step with one (k, v per layer)."""

    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps)
        self.head = nn.Linear(c.dim, c.vocab // c.tp, bias=False)
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, tokens, *cache):
        start = cache[0].shape[2] if cache else 0  # a decode step's position is the cache's length
        cos, sin = self._rotary(start, tokens.shape[1])
        x, new = self.embed(tokens), []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, cos, sin, cache[2 * i:2 * i + 2] if cache else None)
            new += [k, v]
        return (all_gather_last(self.head(self.norm(x[:, -1])), self.config), *new)

    def _rotary(self, start, length):
        pos = torch.arange(start, start + length, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)


def make_model(config: Config = CONFIG_TINY) -> nn.Module:
    torch.manual_seed(0)
    model = Llama(config)
    for p in model.parameters():  # LLaMA's init scale: keeps activations O(1) through the layers
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    return model


def make_inputs(batch: int, input_len: int, seed: int = 0, config: Config = CONFIG_TINY) -> tuple:
    """Prompt tokens for the prefill step."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, config.vocab, (batch, input_len), generator=g),)


def make_decode_inputs(batch: int, kv_len: int, seed: int = 0, config: Config = CONFIG_TINY) -> tuple:
    """One token per sequence and a KV cache of ``kv_len`` tokens (keys, values per layer)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab, (batch, 1), generator=g)
    shape = (batch, config.kv_heads, kv_len, config.head_dim)
    return (tokens, *(torch.randn(shape, generator=g) / math.sqrt(config.head_dim) for _ in range(2 * config.layers)))


def model_file(config: Config, label: str) -> dict:
    """The model-file names (prefill step, and its DECODE step) for one config, and its per-card shard."""
    return {**_steps(config, label), "LAYERS": config.layers, "CONTEXT": config.max_seq,
            "PER_CARD": partial(_per_card_file, config, label)}


def _per_card_file(config: Config, label: str, cards: int, group: str, layers: int | None = None) -> dict:
    """The model file of one card's shard over ``cards`` (optionally with fewer layers)."""
    return _steps(per_card(config, cards, group, layers), f"{label}-tp{cards}")


def _steps(config: Config, label: str) -> dict:
    # The prefill step, and the decode step as a model file of its own inside this one
    # (``models/llama.py:DECODE`` warms it).
    return generative_steps(partial(make_model, config), partial(make_inputs, config=config),
                            partial(make_decode_inputs, config=config), label)


LLAMA2_7B = model_file(CONFIG_7B, "llama-2-7b")
LLAMA2_70B = model_file(CONFIG_2_70B, "llama-2-70b")
LLAMA31_8B = model_file(CONFIG_31_8B, "llama-3.1-8b")
LLAMA31_70B = model_file(CONFIG_31_70B, "llama-3.1-70b")
LLAMA31_405B = model_file(CONFIG_31_405B, "llama-3.1-405b")
_TINY = model_file(CONFIG_TINY, "llama")
TINY_TP = model_file(CONFIG_TINY_TP, "llama-tiny")
AXES, COMPILE, DECODE = _TINY["AXES"], _TINY["COMPILE"], _TINY["DECODE"]
PER_CARD, LAYERS, CONTEXT = _TINY["PER_CARD"], _TINY["LAYERS"], _TINY["CONTEXT"]


if __name__ == "__main__":
    model = make_model().eval()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True)
    with torch.no_grad():
        for step, inputs in (("prefill", make_inputs(2, 24)), ("decode", make_decode_inputs(2, 24))):
            torch.testing.assert_close(compiled(*inputs), model(*inputs))
            print(f"{step}: matches eager")
