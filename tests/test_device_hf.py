"""Tiny Hugging Face models (GPT-2 and LLaMA, made from configs) train and generate on the hpu device in eager
mode, lazy mode and compiled (``torch.compile(model.to("hpu"), backend="hpu_backend")``, whose graphs make
``position_ids`` and masks on the device), with the CPU's losses and greedy tokens."""

from __future__ import annotations

import pytest
import torch

import hpu_backend.device as hd

hd.enable("eager")  # before the process's first backward (see test_device.py)
from hpu_backend import gaudi  # noqa: E402

transformers = pytest.importorskip("transformers")

STEPS, NEW_TOKENS = 2, 4


def make(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0))


def run(kind: str, device: str, compiled: bool = False) -> tuple[list[float], list[list[int]]]:
    """A few AdamW steps (mark_step where lazy mode wants them), then greedy generation."""
    model = make(kind).to(device)
    forward = torch.compile(model, backend="hpu_backend") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(1, 128, (2, 12), generator=g).to(device)
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        gaudi.mark_step()
        opt.step()
        opt.zero_grad()
        gaudi.mark_step()
        losses.append(loss.item())
    model.eval()
    prompt = torch.randint(1, 128, (1, 5), generator=g).to(device)
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return losses, tokens.cpu().tolist()


@pytest.fixture(scope="module")
def cpu_runs():
    return {kind: run(kind, "cpu") for kind in ("gpt2", "llama")}


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", ["eager", "lazy", "compile"])
def test_a_hugging_face_model_trains_and_generates_as_on_the_cpu(cpu_runs, kind, mode):
    hd.enable("eager" if mode == "compile" else mode)
    try:
        losses, tokens = run(kind, "hpu", compiled=mode == "compile")
    finally:
        hd.enable("eager")
    want_losses, want_tokens = cpu_runs[kind]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-5)
    assert tokens == want_tokens
