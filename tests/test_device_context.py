"""The device has one owner: a device context holds its memory, lazy engine, step ledger and enabled device, and
a fresh context starts from nothing and leaves nothing behind; importing the Gaudi names changes nothing."""

import gc
import json
import weakref

import torch

import hpu_backend.device as hd
from conftest import run_python

hd.enable("eager")  # before the process's first backward (see test_device.py)
from hpu_backend import gaudi  # noqa: E402


def _lazy_step(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.float32).to("hpu")
    y = (x * 2 + 1).sum()
    gaudi.mark_step()
    return x, y


def test_a_fresh_context_owns_what_its_device_does_and_the_previous_one_comes_back():
    before = hd.current_context()
    gc.collect()
    allocs, steps = before.memory.memory_stats()["NumAllocs"], len(before.ledger.steps)
    with hd.fresh_context() as ctx:
        assert hd.current_context() is ctx and ctx is not before and hd.current() is None
        assert gaudi.lazy_report() == [] and ctx.memory.allocated() == 0
        hd.enable("lazy")
        x, y = _lazy_step(256)
        assert y.cpu().item() == 256 * 255 + 256
        assert ctx.memory.allocated() == 256 * 4 + 4  # the input and the sum, counted by this context
        # one ledger: the lazy report and the device report read the same steps
        assert [s.index for s in gaudi.lazy_report()] == [s["step"] for s in hd.report()["lazy_graph_steps"]]
        assert gaudi.lazy_report()[0].graphs and hd.report()["steps"][0]["ops"] >= 3
        assert gaudi.memory_allocated() == ctx.memory.allocated()
    assert hd.current_context() is before and hd.current().mode == "eager"
    assert before.memory.memory_stats()["NumAllocs"] == allocs and len(before.ledger.steps) == steps


def _one_run() -> tuple[weakref.ref, tuple]:
    """A run in a context of its own: a lazy step, a switch to eager mode and an eager step."""
    with hd.fresh_context() as ctx:
        hd.enable("lazy")
        _lazy_step(64)
        hd.enable("eager")  # a mode switch ends the lazy step with its ops
        z = (torch.ones(64).to("hpu") * 3).sum()
        gaudi.mark_step()
        assert z.cpu().item() == 192.0
        del z
        gc.collect()
        seen = ([(s.index, s.ops, len(s.graphs)) for s in ctx.ledger.steps], ctx.memory.allocated(),
                ctx.memory.memory_stats()["NumAllocs"])
    return weakref.ref(ctx), seen


def test_contexts_opened_and_closed_leave_no_state_behind():
    runs = [_one_run() for _ in range(3)]
    gc.collect()
    assert all(ref() is None for ref, _ in runs)  # nothing of the process holds a closed context
    seen = [s for _, s in runs]
    # each context counts only its own: the same run gives the same ledger and counters, every tensor freed
    assert seen[0] == seen[1] == seen[2] and seen[0][1] == 0, seen
    assert [ops for _, ops, _ in seen[0][0][:2]] == [4, 3], seen  # the lazy step's ops, then the eager step's


def test_importing_the_gaudi_names_changes_nothing_in_the_process():
    out = run_python("""
import json, sys, torch, torch.distributed as dist
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

def state():
    return [torch._C._get_privateuse1_backend_name(), hasattr(torch, "hpu"), sorted(dist.Backend.backend_list),
            len(_get_current_dispatch_mode_stack()), torch._C._len_torch_function_stack()]

before = state()
import hpu_backend.gaudi as htcore
import hpu_backend.gaudi.lazy_mode, hpu_backend.gaudi.mixed_precision, hpu_backend.device
from hpu_backend.device import context
from hpu_backend.serve import session
after = state()
x = torch.ones(3) + 1  # runs at once: no lazy mode was entered
print(json.dumps({"same": before == after, "after": after, "context": context._OWNER.context is not None,
                  "observers": len(session.EVERY_RUN), "lazy": htcore.is_lazy(), "x": x.tolist()}))
""", {"PT_HPU_LAZY_MODE": "1"})
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc == {"same": True, "after": doc["after"], "context": False, "observers": 0, "lazy": False,
                   "x": [2.0, 2.0, 2.0]}, doc
    assert "hccl" not in doc["after"][2] and doc["after"][:2] == ["privateuseone", False]


def test_a_device_enabled_after_the_first_backward_runs_a_backward():
    out = run_python("""
import torch
a = torch.ones(2, requires_grad=True)
(a * 2).sum().backward()  # the process's first backward, before the device exists
import hpu_backend.device as hd
hd.enable("eager")
w = torch.ones(3).to("hpu").requires_grad_()
(w * 3).sum().backward()
print(w.grad.cpu().tolist(), a.grad.tolist())
""")
    assert out.strip().splitlines()[-1] == "[3.0, 3.0, 3.0] [2.0, 2.0]"
