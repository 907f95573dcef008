"""The Gaudi docs' training loop in lazy-mode style: eager code, ``mark_step()`` after backward and after the step.

On Gaudi this script imports ``habana_frameworks.torch.core as htcore``; here ``hpu_backend.gaudi`` stands for it.
Without lazy mode the same loop runs eagerly (``mark_step`` only counts), which is what the tests compare with.
Run as a script (``PT_HPU_LAZY_MODE=1 python models/lazy_training.py [mnist|gpt] [steps]``) to train lazily
(in ``with htcore.lazy():``, as the device's mode is read: ``hpu_backend/device/release.py``) and print the
per-step report: graphs, recipes compiled and host syncs with their source lines.
It is also a model file (``hpurecipe analyze models/lazy_training.py --lazy --train``): models/mnist.py's model.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable, Iterable

import torch

import hpu_backend.gaudi as htcore


def train(model: torch.nn.Module, batches: Iterable, loss_fn: Callable, optimizer: torch.optim.Optimizer,
          steps: int, log_interval: int = 0) -> torch.Tensor:
    """``steps`` optimizer steps over ``batches`` of (data, target); the losses, one per step."""
    model.train()
    losses = []
    for batch_idx, (data, target) in zip(range(steps), batches):
        optimizer.zero_grad(set_to_none=True)
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        htcore.mark_step()
        optimizer.step()
        htcore.mark_step()
        losses.append(loss.detach())
        if log_interval and batch_idx % log_interval == 0:
            print(f"step {batch_idx} loss {loss.item():.4f}")  # a host sync: the docs advise doing it rarely
    return torch.stack(losses)


def mnist_run(mnist, steps: int, batch: int = 4, lr: float = 0.05, log_interval: int = 0):
    """The MNIST example (models/mnist.py): losses and the trained model."""
    torch.manual_seed(0)
    model = mnist.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = (mnist.make_inputs(batch, seed=i) for i in range(steps))
    loss_fn = torch.nn.functional.nll_loss
    return train(model, batches, loss_fn, optimizer, steps, log_interval), model


def gpt_run(gpt, steps: int, batch: int = 2, seq: int = 16, layers: int = 1, lr: float = 0.05):
    """The GPT model (models/gpt.py) trained on next-token prediction: losses and the trained model."""
    model = gpt.make_model(layers)
    optimizer = htcore.FusedSGD(model.parameters(), lr=lr, momentum=0.9)
    batches = (gpt.make_inputs(batch, seq, seed=i) for i in range(steps))
    return train(model, batches, lambda logits, targets: gpt.loss(logits, None, targets), optimizer, steps), model


def _load(name: str):
    """A sibling model file, as a module (model files are plain scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"lazy_training_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_mnist = _load("mnist")
make_model, make_inputs, loss, MODEL_INPUTS = _mnist.make_model, _mnist.make_inputs, _mnist.loss, _mnist.MODEL_INPUTS
AXES = {"batch": [4, 8]}
COMPILE = {"options": {}}


if __name__ == "__main__":
    from contextlib import nullcontext

    from hpu_backend.device.release import mode_from_env

    name = sys.argv[1] if len(sys.argv) > 1 else "mnist"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    module = _load(name)
    run = mnist_run if name == "mnist" else gpt_run
    kwargs = {"log_interval": 5} if name == "mnist" else {}
    with htcore.lazy() if mode_from_env() == "lazy" else nullcontext():  # PT_HPU_LAZY_MODE=1: lazily
        losses, _ = run(module, steps, **kwargs)
        print("losses:", " ".join(f"{v:.4f}" for v in losses.tolist()))
    print(htcore.lazy_report())
