"""A small decoder-only transformer (GPT-style, F.scaled_dot_product_attention), any sequence length.

A model file for `hpurecipe warm`: make_model, make_inputs, AXES, COMPILE, loss.
Run as a script for a compiled forward pass at a few lengths, compared with eager.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256
MAX_SEQ = 2048


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 64, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(MAX_SEQ, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_model(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return GPT(layers=layers)


def make_inputs(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets (fresh contiguous tensors: a slice of a longer row would
    carry a stride of seq + 1, which Dynamo turns into a second shape symbol)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, seq + 1), generator=g)
    return tokens[:, :-1].clone(memory_format=torch.contiguous_format), tokens[:, 1:].clone(
        memory_format=torch.contiguous_format)


def loss(logits: torch.Tensor, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


MODEL_INPUTS = 1
CONTEXT = MAX_SEQ  # learned positions: no sequence is longer
AXES = {"batch": [1, 2], "seq": [16, 32, 64, 128]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:16"}}


if __name__ == "__main__":
    model = make_model().eval()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True)
    with torch.no_grad():
        for seq in (8, 37, 100):
            (tokens, _) = make_inputs(2, seq)
            torch.testing.assert_close(compiled(tokens), model(tokens))
            print(f"seq {seq}: matches eager")
