"""A small ResNet (BasicBlocks with BatchNorm, CIFAR-sized images), trainable in channels_last.

A model file for `hpurecipe warm`: make_model, make_inputs, AXES, COMPILE, loss.
Run as a script to train a few SGD steps with backend="hpu_backend" (also in channels_last).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = 10


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and b == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return ResNet()


def make_inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One synthetic CIFAR-sized batch: images and labels."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 32, 32, generator=g)
    labels = torch.randint(0, CLASSES, (batch,), generator=g)
    return images, labels


def loss(output: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, labels)


MODEL_INPUTS = 1  # make_inputs(...)[:1] feed the model; the rest feed loss()
AXES = {"batch": [8, 16, 32]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:8"}}


def train(steps: int = 3, backend: str | None = "hpu_backend", batch: int = 8, seed: int = 0,
          lr: float = 0.05, channels_last: bool = False, options: dict | None = None):
    """SGD on synthetic data; returns (per-step losses, trained model). backend=None trains eagerly."""
    torch.manual_seed(seed)
    model = make_model()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    step_model = model if backend is None else torch.compile(model, backend=backend, options=options)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        images, labels = make_inputs(batch, seed=seed + step)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        value = loss(step_model(images), images, labels)
        value.backward()
        opt.step()
        losses.append(value.detach())
    return torch.stack(losses), model


if __name__ == "__main__":
    for cl in (False, True):
        losses, _ = train(channels_last=cl)
        print(f"channels_last={cl} losses:", " ".join(f"{v:.4f}" for v in losses.tolist()))
