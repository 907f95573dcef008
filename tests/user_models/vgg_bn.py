"""A VGG-style CNN with batch norm, as a new user writes one (the advisor's test model; kept as written)."""
import torch
import torch.nn as nn


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


class VGG(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(block(3, 4), block(4, 8))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, classes))

    def forward(self, x):
        return self.head(self.features(x))


def make_model():
    torch.manual_seed(0)
    return VGG()


def make_inputs(batch):
    return (torch.randn(batch, 3, 8, 8),)


AXES = {"batch": [1, 4, 16]}
COMPILE = {"dynamic": True}
