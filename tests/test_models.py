"""The example models compiled with hpu_backend match eager PyTorch (training and inference)."""

from __future__ import annotations

import pytest
import torch

from conftest import load_model_file


@pytest.mark.e2e
def test_mnist_20_sgd_steps_match_eager():
    mnist = load_model_file("mnist")
    eager_losses, eager_model = mnist.train(steps=20, backend=None)
    hpu_losses, hpu_model = mnist.train(steps=20, backend="hpu_backend")
    torch.testing.assert_close(hpu_losses, eager_losses)
    for (name, a), b in zip(hpu_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, msg=lambda m: f"{name}: {m}")
    assert eager_losses[-1] < eager_losses[0]  # it really trains


@pytest.mark.e2e
@pytest.mark.parametrize("seq", [8, 37])
def test_gpt_inference_and_gradients_match_eager(seq):
    gpt = load_model_file("gpt")
    model, ref = gpt.make_model(), gpt.make_model()
    tokens, targets = gpt.make_inputs(2, seq)
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), ref(tokens))
    gpt.loss(compiled(tokens), tokens, targets).backward()
    gpt.loss(ref(tokens), tokens, targets).backward()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=lambda m: f"{name}: {m}")
