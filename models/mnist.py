"""MNIST CNN from the Gaudi torch.compile example, trained on synthetic MNIST-shaped data.

A model file for `hpurecipe warm`: make_model, make_inputs, AXES, COMPILE, loss.
Run as a script to train 20 SGD steps with backend="hpu_backend" and print the losses.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def make_model() -> nn.Module:
    return Net()


def make_inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One synthetic MNIST batch: images (normalized like MNIST) and labels."""
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(batch, 1, 28, 28, generator=g) - 0.1307) / 0.3081
    labels = torch.randint(0, 10, (batch,), generator=g)
    return images, labels


def loss(output: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(output, labels)


MODEL_INPUTS = 1  # make_inputs(...)[:1] feed the model; the rest feed loss()
AXES = {"batch": [8, 16, 32, 64]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:8"}}


def train(steps: int = 20, backend: str | None = "hpu_backend", batch: int = 32, seed: int = 0,
          lr: float = 0.05, options: dict | None = None):
    """SGD on synthetic data; returns (per-step losses, trained model). backend=None trains eagerly."""
    torch.manual_seed(seed)
    model = make_model()
    step_model = model if backend is None else torch.compile(model, backend=backend, options=options)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        images, labels = make_inputs(batch, seed=seed + step)
        opt.zero_grad()
        value = loss(step_model(images), images, labels)
        value.backward()
        opt.step()
        losses.append(value.detach())
    return torch.stack(losses), model


if __name__ == "__main__":
    from hpu_backend.metrics import metric_global

    losses, _ = train()
    print("losses:", " ".join(f"{v:.4f}" for v in losses.tolist()))
    print("graph_compilation:", metric_global("graph_compilation").stats())
