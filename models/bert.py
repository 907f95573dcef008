"""A small BERT-style encoder with a padding mask and attention written out by hand.

A model file for `hpurecipe warm`: make_model, make_inputs, AXES, COMPILE, loss. The attention
is ``softmax(q @ kᵀ / √d + mask) @ v`` in plain ops: the lowering costs it as written and says what a
FusedSDPA call would save.
Run as a script for a compiled forward pass at a few lengths, compared with eager.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 512
MAX_SEQ = 512
CLASSES = 4


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, bias):
        b, s, d = x.shape
        q, k, v = (t(x).view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + bias
        y = scores.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn = SelfAttention(dim, heads)
        self.ln1 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x, bias):
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.ffn(x))


class Bert(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 64, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(MAX_SEQ, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens, mask):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.ln(self.tok(tokens) + self.pos(pos))
        # Padding keys get a large negative bias, so their attention weight is exactly zero.
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e9
        for layer in self.layers:
            x = layer(x, bias)
        return self.head(x[:, 0])


def make_model(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return Bert(layers=layers)


def make_inputs(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, a padding mask (1 = real token; each row at least half full) and class labels."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint((seq + 1) // 2, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    labels = torch.randint(0, CLASSES, (batch,), generator=g)
    return tokens, mask, labels


def loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


MODEL_INPUTS = 2  # tokens and mask feed the model; labels feed loss()
AXES = {"batch": [2, 4], "seq": [16, 32, 64, 128]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:16"}}


if __name__ == "__main__":
    model = make_model().eval()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True)
    with torch.no_grad():
        for seq in (8, 37, 100):
            tokens, mask, _ = make_inputs(2, seq)
            torch.testing.assert_close(compiled(tokens, mask), model(tokens, mask))
            print(f"seq {seq}: matches eager")
