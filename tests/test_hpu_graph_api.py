"""Gaudi's explicit HPU-graph API on the hpu device (``torch.hpu.HPUGraph``, ``torch.hpu.graph``, the ``graphs``
helpers), in eager and in lazy mode, as Optimum Habana calls it: a capture's outputs right after
``capture_end()`` (CogVideoX), replays into the same output tensors after the static inputs are refilled, and
fast DDP's gradient packing into views of a fused buffer — each compared with the same code on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

import hpu_backend.device as hd

hd.enable("eager")  # before any backward of the process (see test_device.py)
from hpu_backend.device.graphs import HPUGraphError  # noqa: E402
from hpu_backend.gaudi import graphs, lazy_report  # noqa: E402
from hpu_backend.run import names  # noqa: E402


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


@torch.no_grad()
def test_a_capture_runs_once_and_replays_into_the_same_outputs(device_mode):
    model = _mlp()
    on_device = copy.deepcopy(model).to("hpu")
    x = torch.randn(4, 6)
    static = x.to("hpu")
    g = torch.hpu.HPUGraph()
    g.capture_begin()
    out = on_device(static)
    g.capture_end()
    torch.testing.assert_close(out.cpu(), model(x))  # used without a replay: the capture ran the work

    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(4, 6)
        static.copy_(x.to("hpu"))
        events = len(hd.current().timeline.events)
        g.replay()
        torch.testing.assert_close(out.cpu(), model(x))  # the same output tensor, written anew
        launched = [e[:2] for e in hd.current().timeline.events[events:] if e[0] in ("op", "launch")]
        assert launched[-1] == ("launch", "replay") and ("op", device_mode) not in launched  # one launch, no ops

    runs = [r for step in lazy_report() for r in step.graphs if r.cut_by == "HPUGraph.replay"]
    assert len(runs) == 2 and all(r.compiled == 0 and r.ops == runs[0].ops > 0 for r in runs)


def _fused(params, dtype=torch.float32):
    """fast_ddp's fusion buffer and one view of it per gradient."""
    total = sum(p.grad.numel() for p in params)
    buffer = torch.zeros(total, dtype=dtype, device=params[0].device)
    views, at = [], 0
    for p in params:
        views.append(buffer[at:at + p.grad.numel()].reshape(p.grad.shape))
        at += p.grad.numel()
    return buffer, views


def _pack(params, views, scale: float) -> None:
    for p, view in zip(params, views):
        grad = p.grad
        if grad.dtype != view.dtype:
            grad = grad.to(view.dtype)
        view.copy_(grad * scale)


def _unpack(params, views) -> None:
    for p, view in zip(params, views):
        p.grad.copy_(view.to(p.grad.dtype))


def test_fast_ddp_packs_gradients_into_views_of_a_fused_buffer(device_mode):
    model = _mlp()
    on_device = copy.deepcopy(model).to("hpu")
    x = torch.randn(4, 6)
    model(x).square().sum().backward()
    on_device(x.to("hpu")).square().sum().backward()
    cpu_params, params = list(model.parameters()), list(on_device.parameters())
    cpu_buffer, cpu_views = _fused(cpu_params, torch.bfloat16)
    buffer, views = _fused(params, torch.bfloat16)

    pack, unpack = torch.hpu.HPUGraph(), torch.hpu.HPUGraph()
    with torch.hpu.stream(torch.hpu.Stream()):
        pack.capture_begin()
        _pack(params, views, 0.5)
        pack.capture_end()
    _pack(cpu_params, cpu_views, 0.5)
    torch.testing.assert_close(buffer.cpu(), cpu_buffer)

    for step in range(2):
        with torch.no_grad():  # new gradients, in the same tensors
            for p, q in zip(cpu_params, params):
                p.grad.mul_(step + 2).add_(1)
                q.grad.mul_(step + 2).add_(1)
        pack.replay()
        _pack(cpu_params, cpu_views, 0.5)
        torch.testing.assert_close(buffer.cpu(), cpu_buffer)

        buffer.mul_(3)  # the all-reduce's stand-in
        cpu_buffer.mul_(3)
        if step == 0:
            with torch.hpu.stream(torch.hpu.Stream()):
                unpack.capture_begin()
                _unpack(params, views)
                unpack.capture_end()
        else:
            unpack.replay()
        _unpack(cpu_params, cpu_views)
        for p, q in zip(cpu_params, params):
            torch.testing.assert_close(q.grad.cpu(), p.grad)


@torch.no_grad()
def test_the_graph_context_manager_captures_as_capture_begin_and_end(device_mode):
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    sa, sb = a.to("hpu"), b.to("hpu")
    g = torch.hpu.HPUGraph()
    with torch.hpu.graph(g):
        out = (sa @ sb).relu() + 1
    torch.testing.assert_close(out.cpu(), (a @ b).relu() + 1)
    a2 = torch.randn(3, 5)
    graphs.copy_to([sa], [a2.to("hpu")])
    g.replay()
    torch.testing.assert_close(out.cpu(), (a2 @ b).relu() + 1)


def test_what_needs_the_host_inside_a_capture_is_a_one_line_error(device_mode):
    x = torch.randn(4).to("hpu")
    g = torch.hpu.HPUGraph()
    g.capture_begin()
    y = x * 2
    with pytest.raises(HPUGraphError, match=r"Tensor.item at .*test_hpu_graph_api.py:\d+ cannot be captured") as e:
        y.sum().item()
    assert "\n" not in str(e.value)
    with pytest.raises(HPUGraphError, match="without a capture under way"):
        g.capture_end()  # the error ended the capture
    with pytest.raises(HPUGraphError, match="before capture_end"):
        g.replay()
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)  # the device runs as before

    with pytest.raises(HPUGraphError, match="aten.nonzero.* cannot be captured in an HPU graph: it runs on the host"):
        with torch.hpu.graph(g):
            (x > 0).nonzero()
    with pytest.raises(ValueError, match="the block's own"):
        with torch.hpu.graph(g):
            x * 3
            raise ValueError("the block's own error")
    device = hd.current()
    assert device.capture is None and device.lazy == (device_mode == "lazy")  # the device is back in its mode
    g.capture_begin()
    with pytest.raises(HPUGraphError, match="captures do not nest"):
        torch.hpu.HPUGraph().capture_begin()
    g.capture_end()
    g.replay()  # nothing recorded: nothing replayed


def test_input_hash_and_copy_to_follow_nested_inputs():
    a, b = torch.zeros(2, 3), torch.ones(4)
    assert graphs.input_hash([a, (b, None), False]) == graphs.input_hash([torch.ones(2, 3), (b * 5, None), False])
    assert graphs.input_hash([a, (b, None), False]) != graphs.input_hash([a, (b, None), True])
    assert graphs.input_hash([a, 1]) != graphs.input_hash([a, 2])
    assert graphs.input_hash({"x": a}) != graphs.input_hash({"x": torch.zeros(3, 2)})

    dst = [torch.zeros(2), (torch.zeros(3), None), {"k": torch.zeros(1)}, False]
    src = [torch.full((2,), 1.0), (torch.full((3,), 2.0), None), {"k": torch.full((1,), 3.0)}, False]
    graphs.copy_to(dst, src)
    torch.testing.assert_close(dst[0], src[0])
    torch.testing.assert_close(dst[1][0], src[1][0])
    torch.testing.assert_close(dst[2]["k"], src[2]["k"])
    with pytest.raises(HPUGraphError, match="2 values for 1 static inputs"):
        graphs.copy_to([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)])
    cached = graphs.CachedParams(dst, src[0], None)
    assert cached.graph_inputs is dst and cached.graph is None


def test_gaudi_names_reach_the_graph_api():
    hpu = names._hpu_module()
    assert hpu.HPUGraph is graphs.HPUGraph and hpu.graph is graphs.graph and hpu.graphs is graphs
    spec = names._FINDER.find_spec(f"{names.HPU}.graphs")
    assert names._FINDER.create_module(spec) is graphs
