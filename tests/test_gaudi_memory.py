"""hpu_backend.gaudi's memory counters: the simulated device memory of the recipes that ran."""

import gc

import pytest
import torch

import hpu_backend.gaudi as hg
from conftest import run_python
from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.targets import device


def _bytes(*tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.e2e
def test_memory_counts_what_ran_and_its_planned_arena():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    x = torch.randn(8, 32)
    gc.collect()
    before = hg.memory_allocated()
    hg.reset_peak_memory_stats()
    assert hg.max_memory_allocated() == before
    with torch.no_grad(), collect_recipes() as found:
        out = compiled(x)
    torch.testing.assert_close(out, model(x))
    (recipe,) = [r for _, r, _ in found]
    held = _bytes(x, *model.parameters(), out)
    assert hg.memory_allocated() - before == held
    arena = recipe.facts["memory"]["arena_bytes"]
    assert arena > 0 and hg.max_memory_allocated() - before == held + arena
    stats = hg.memory_stats()
    assert stats["InUse"] == hg.memory_allocated() and stats["MaxInUse"] == hg.max_memory_allocated()
    assert stats["Limit"] == device("gaudi2").hbm_bytes and stats["NumAllocs"] >= 6

    with torch.no_grad():
        again = compiled(x)  # the same parameters and input: only the new output is newly held
        compiled(x)  # an output nobody keeps is freed at once
    assert hg.memory_allocated() - before == held + _bytes(again)
    del out
    gc.collect()
    assert hg.memory_allocated() - before == held  # x, the parameters and the second output (the same size)
    del again
    gc.collect()
    assert hg.memory_allocated() - before == _bytes(x, *model.parameters())  # both outputs freed
    hg.reset_peak_memory_stats()
    assert hg.max_memory_allocated() == hg.memory_allocated()
    frees = hg.memory_stats()["NumFrees"]
    del x
    gc.collect()
    assert hg.memory_stats()["NumFrees"] == frees + 1


@pytest.mark.e2e
def test_training_keeps_saved_activations_until_the_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    x = torch.randn(128, 32)
    hg.reset_peak_memory_stats()  # the counters count from their first use: x and the parameters from the next run
    compiled(x).sum().backward()  # compile first; then count a step from a clean peak
    for p in model.parameters():
        p.grad = None
    gc.collect()
    start = hg.memory_allocated()
    loss = compiled(x).sum()
    after_forward = hg.memory_allocated()
    assert after_forward - start >= 128 * 256 * 4  # at least the GELU's input, saved for the backward
    loss.backward()
    del loss
    gc.collect()
    grads = _bytes(*(p.grad for p in model.parameters()))
    assert hg.memory_allocated() - start == grads < after_forward - start  # saved activations freed, grads held
    assert hg.max_memory_allocated() >= after_forward



@pytest.mark.e2e
def test_the_counters_cost_nothing_until_first_used():
    """A process that never reads them compiles and calls without observing runs; the first reading starts them,
    and from then on every run counts (a fresh process: here the counters are started)."""
    out = run_python(
        "import torch\n"
        "import hpu_backend.gaudi as hg\n"
        "from hpu_backend.serve import session\n"
        "f = torch.compile(lambda x: x * 2, backend='hpu_backend', options={'cache': False})\n"
        "x = torch.randn(64)\n"
        "kept = f(x)\n"
        "print(len(session.EVERY_RUN), hg.memory_allocated())\n"
        "again = f(x)\n"
        "print(len(session.EVERY_RUN), hg.memory_allocated())\n")
    assert out.split("\n")[:2] == ["0 0", f"1 {2 * 64 * 4}"]  # unobserved until read; then x and the new output
