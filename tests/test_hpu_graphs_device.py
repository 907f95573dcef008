"""HPU graphs of device modules as Gaudi inference code writes them: dtype casts inside the forward, the
forward's signature seen by ``generate()``, and a KV-cache decode step that updates its inputs in place —
each replay compared with the same module run on the CPU."""

from __future__ import annotations

import copy
import inspect

import torch

import hpu_backend.device as hd

hd.enable("eager")  # before any backward of the process (see test_device.py)
from hpu_backend.gaudi import wrap_in_hpu_graph  # noqa: E402


class Casting(torch.nn.Module):
    """A bf16 model edge: the input cast up, the output cast down, the mask cast to the scores' dtype."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, attention_mask=None):
        y = self.lin(x.to(torch.float32))
        if attention_mask is not None:
            y = y * attention_mask.to(y.dtype)
        return y.to(torch.bfloat16)


class Decode(torch.nn.Module):
    """One decode step: the new key and value written into the caches at ``pos``, a step counter buffer
    bumped, then attention over the caches."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.kv = torch.nn.Linear(8, 16)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, k_cache, v_cache, pos, attention_mask=None):
        k, v = self.kv(x).chunk(2, -1)
        k_cache.index_copy_(1, pos, k)
        v_cache.index_copy_(1, pos, v)
        self.steps.add_(1)
        scores = self.q(x) @ k_cache.transpose(1, 2) + attention_mask
        return scores.softmax(-1) @ v_cache


def _replays(graphed) -> int:
    return sum(g is not None for g in graphed.forward.graphs.values())


def test_a_forward_that_casts_dtypes_replays_on_the_device(device_mode):
    torch.manual_seed(0)
    model = Casting().eval()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model).to("hpu"))
    with torch.no_grad():
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            x, mask = torch.randn(2, 4, generator=g), (torch.rand(2, 4, generator=g) > 0.5).to(torch.int64)
            out = graphed(x.to("hpu").to(torch.bfloat16), attention_mask=mask.to("hpu"))
            torch.testing.assert_close(out.cpu(), model(x.to(torch.bfloat16), attention_mask=mask))
    assert _replays(graphed) == 1 and graphed.forward.captures == 1


def test_the_wrapper_keeps_the_forward_signature():
    model = Decode().eval()
    expected = inspect.signature(model.forward)
    graphed = wrap_in_hpu_graph(model)
    assert inspect.signature(graphed.forward) == expected
    assert "attention_mask" in inspect.signature(graphed.forward).parameters


def _decode_steps(model, device: str, steps: int = 4):
    """Greedy-style decode over preallocated caches; the outputs and the caches after every step (on the CPU)."""
    caches = [torch.zeros(2, 6, 8).to(device) for _ in range(2)]
    seen = []
    with torch.no_grad():
        for t in range(steps):
            g = torch.Generator().manual_seed(t)
            x = torch.randn(2, 1, 8, generator=g)
            mask = torch.where(torch.arange(6) <= t, 0.0, float("-inf")).view(1, 1, 6)
            out = model(x.to(device), *caches, torch.tensor([t]).to(device), attention_mask=mask.to(device))
            seen.append([out.cpu(), *(c.cpu().clone() for c in caches)])  # .cpu() of a CPU tensor is itself
    return seen


def test_a_kv_cache_decode_step_is_captured_and_its_in_place_updates_replay(device_mode):
    torch.manual_seed(0)
    model = Decode().eval()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model).to("hpu"))
    calls = []
    graphed.kv.register_forward_hook(lambda *_: calls.append(1))
    expected = _decode_steps(model, "cpu")
    got = _decode_steps(graphed, "hpu")
    for e, g in zip(expected, got):
        for want, have in zip(e, g):
            torch.testing.assert_close(have, want)
    assert _replays(graphed) == 1 and graphed.forward.captures == 1
    assert len(calls) == 1  # the module ran once, at capture; the four steps were replays
    assert graphed.steps.cpu().item() == model.steps.item() == 4  # the buffer update replays too


def test_a_train_mode_buffer_update_is_still_not_captured(caplog):
    model = torch.nn.BatchNorm1d(4).train()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model))
    x = torch.randn(8, 4)
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x))
    torch.testing.assert_close(graphed.running_mean, model.running_mean)
    assert _replays(graphed) == 0 and "train mode" in caplog.text


def test_module_cacher_trains_as_the_cpu_and_captures_once_per_signature(device_mode):
    """hpu.ModuleCacher (HPU graphs for training): the wrapped module trains with the CPU's gradients; in lazy
    mode each new input signature is captured once (at most ``max_graphs`` kept), a repeat replays; in eager
    mode (no HPU graphs on Gaudi) the module runs as it is."""
    from hpu_backend.gaudi import mark_step
    from hpu_backend.gaudi.graphs import ModuleCacher

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    cached = ModuleCacher(max_graphs=1)(model=copy.deepcopy(model).to("hpu"), inplace=True)
    for rows in (3, 3, 5, 3):
        x = torch.randn(rows, 4)
        model.zero_grad()
        cached.zero_grad()
        model(x).sum().backward()
        cached(x.to("hpu")).sum().backward()
        mark_step()
        for ours, cpu in zip(cached.parameters(), model.parameters()):
            torch.testing.assert_close(ours.grad.cpu(), cpu.grad)
    lazy = device_mode == "lazy"
    assert (cached.forward.captures, cached.forward.replays) == ((3, 1) if lazy else (0, 0))  # 5 rows evicted 3
