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


def test_the_same_generation_twice_in_lazy_mode_runs_the_graphs_of_the_first():
    """A decode step's graph is cut where the host reads a value; the cuts, and so the graphs, must be the same
    in every run of the same generation, whatever address the allocator gives a new tensor (an address a pending
    tensor had before it died is no pending tensor): once a generation has run, running it again compiles
    nothing."""
    hd.enable("lazy")
    try:
        model = make("gpt2").to("hpu").eval()
        prompt = torch.randint(1, 128, (1, 5), generator=torch.Generator().manual_seed(2)).to("hpu")

        def generate() -> tuple[list[int], list]:
            before = gaudi.lazy_report()[-1].index if gaudi.lazy_report() else -1
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
            tokens = out.cpu().tolist()
            gaudi.mark_step()  # the generation's graphs are a step of their own
            return tokens, [g for s in gaudi.lazy_report() if s.index > before for g in s.graphs]

        first, _ = generate()  # (the first call also sets up the model's generation config and caches)
        second, graphs = generate()
        third, again = generate()
    finally:
        hd.enable("eager")
    assert first == second == third and len(first[0]) == 13
    assert len(again) == len(graphs) > 8 and [g.new for g in again if g.new] == []
