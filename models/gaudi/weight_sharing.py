"""Weight sharing on the device, as Gaudi's documentation asks: tie the weights after ``.to("hpu")``.

A tiny language-model head whose output projection shares the embedding's weight. Moving a module copies
each parameter, so a tie made before the move must be made again after it; the script ties after the move
and checks that the two layers hold one tensor. Losses go to ``--losses`` (JSON) for comparison with the CPU.

    hpurecipe run models/gaudi/weight_sharing.py --hpu
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class TiedLM(nn.Module):
    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def tie(self):
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hpu", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--losses")
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.hpu:
        import habana_frameworks.torch.core as htcore  # noqa: F401

        device = torch.device("hpu")
    model = TiedLM().to(device)
    model.tie()  # after the move: the device holds one weight for both layers
    assert model.head.weight is model.embed.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (8, 12), generator=g)
    losses = []
    for _ in range(args.steps):
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        if args.hpu:
            htcore.mark_step()
        losses.append(loss.item())
    assert model.head.weight is model.embed.weight and len(list(model.parameters())) == 3
    print("losses", [round(v, 5) for v in losses])
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump({"losses": losses, "device": device.type}, f)


if __name__ == "__main__":
    main()
