"""Attention with Gaudi's fused kernel, ``hpex.kernels.FusedSDPA``, on the device (torch's SDPA on the CPU).

A one-layer causal self-attention block trained for a few steps; mark_step ends each step in lazy mode.
Losses go to ``--losses`` (JSON) for comparison with the CPU run of the same script.

    hpurecipe run models/gaudi/sdpa.py --hpu
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, fused=None):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.heads = heads
        self.fused = fused

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused is not None:  # Gaudi's kernel: (q, k, v, attn_mask, dropout_p, is_causal)
            y = self.fused.apply(q, k, v, None, 0.0, True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hpu", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--losses")
    args = p.parse_args()
    torch.manual_seed(0)
    device, fused, htcore = torch.device("cpu"), None, None
    if args.hpu:
        import habana_frameworks.torch.core as htcore
        from habana_frameworks.torch.hpex.kernels import FusedSDPA as fused

        device = torch.device("hpu")
    model = Attention(fused=fused).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    x, target = torch.randn(2, 16, 32, generator=g), torch.randn(2, 16, 32, generator=g)
    losses = []
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
        if htcore is not None:
            htcore.mark_step()
        losses.append(loss.item())
    print("losses", [round(v, 5) for v in losses])
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump({"losses": losses, "device": device.type}, f)


if __name__ == "__main__":
    main()
