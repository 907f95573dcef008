"""A deliberately poor model file for `hpurecipe advise`: each habit the Gaudi checklist warns about, once.

A model file for `hpurecipe warm`: make_model, make_inputs, AXES, COMPILE, loss. Its habits, and the line
`hpurecipe advise models/poor_habits.py --train` names for each:
- attention written out as softmax(QKᵀ)V instead of a FusedSDPA call;
- a `.item()` read in the forward (a host sync, and a graph break);
- a loop constant: a Python index into a list of step scales, new on every call;
- an op that falls back to the CPU (bessel_j0);
- an unfused torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ in the training loop;
- `torch.autocast(device_type="hpu")`, which casts nothing on the simulated device.
Run as a script to train a few steps eagerly-compiled with backend="hpu_backend".
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401 (advise names this file's lines: they stay where they are)

DIM, HEADS = 32, 4
STEP_SCALES = [1.0 - 0.05 * i for i in range(20)]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.step = 0

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS)
        y = scores.softmax(-1) @ v
        y = self.out(y.transpose(1, 2).reshape(b, s, DIM))
        y = y * STEP_SCALES[self.step % len(STEP_SCALES)]
        self.step += 1
        y = y + 0.01 * torch.special.bessel_j0(y.detach())
        if y.abs().max().item() > 1e4:
            y = y / 1e4
        return y


def make_model() -> nn.Module:
    return Block()


def make_inputs(batch: int, seq: int = 16, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, seq, DIM, generator=g),)


def loss(output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


AXES = {"batch": [2, 4]}
COMPILE = {"dynamic": False, "options": {}}


def train(steps: int = 3):
    model = make_model()
    compiled = torch.compile(model, backend="hpu_backend")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        (x,) = make_inputs(4, seed=step)
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            value = loss(compiled(x), x)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {value.item():.4f}")


if __name__ == "__main__":
    train()
