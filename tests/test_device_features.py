"""The hpu device's Gaudi semantics: device memory and OOM, CPU fallbacks and strict mode, autocast on "hpu",
host reads as syncs, torch.compile on device tensors, pinned-memory loaders."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hpu_backend.device as hd

# The device exists from collection on: torch's autograd engine sizes its per-device queues at the process's
# first backward, so a device enabled after one cannot run a backward (a script under the launcher has the
# device from its first line). Enabling it is global to the process (PrivateUse1 renamed, torch.hpu).
hd.enable("eager")
from hpu_backend import gaudi
from hpu_backend.device.context import current_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def eager():
    yield hd.enable("eager")
    current_context().memory.set_capacity(None)


@pytest.fixture
def lazy():
    yield hd.enable("lazy")
    hd.enable("eager")


def test_memory_counts_every_device_tensor_and_oom_names_request_use_and_capacity(eager):
    hpu = torch.hpu
    gc.collect()  # device tensors in garbage cycles of earlier tests are freed now, not inside the deltas below
    start = hpu.memory_allocated()
    a = torch.empty(1024, device="hpu")
    assert hpu.memory_allocated() - start == 4096
    model = nn.Linear(64, 64).to("hpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 64, device="hpu")).sum().backward()
    before_step = hpu.memory_allocated()
    opt.step()  # the momentum buffers: optimizer state made outside any compiled graph
    assert hpu.memory_allocated() - before_step >= (64 * 64 + 64) * 4
    del a
    assert hpu.max_memory_allocated() >= hpu.memory_allocated()
    hpu.reset_peak_memory_stats()
    assert hpu.max_memory_allocated() == hpu.memory_allocated()
    free, total = hpu.mem_get_info()
    assert total == hpu.memory_stats()["Limit"] and free == total - hpu.memory_allocated()
    current_context().memory.set_capacity(hpu.memory_allocated() + 10_000)
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(1 << 20, device="hpu")
    text = str(e.value)
    assert "\n" not in text and "tried to allocate 4.00 MiB" in text and "in use" in text and "gaudi2" in text


def test_unsupported_dtype_falls_back_in_eager_mode_and_strict_mode_refuses(eager):
    x = torch.rand(4, dtype=torch.bfloat16) + 0.5
    device = hd.current()
    before = device.fallbacks[("aten::digamma", ("bfloat16",))]
    torch.testing.assert_close(torch.digamma(x.to("hpu")).cpu(), torch.digamma(x))
    assert device.fallbacks[("aten::digamma", ("bfloat16",))] == before + 1
    assert not any(op == "aten::add" for op, _ in device.fallbacks)  # supported ops stay on the device
    hd.enable("eager", {"strict": True})
    with pytest.raises(hd.DeviceFallbackError, match="aten::digamma \\(bfloat16\\).*strict"):
        torch.digamma(x.to("hpu"))
    torch.digamma(x.float().to("hpu"))  # float32 digamma runs on the device


def test_fallback_log_lines_and_exit_table_in_gaudi_format():
    code = textwrap.dedent("""
        import torch, hpu_backend.device as hd
        hd.enable("eager")
        x = torch.rand(4, dtype=torch.bfloat16, device="hpu")
        for _ in range(3):
            torch.lgamma(x)
        print("done")
    """)
    env = dict(os.environ, LOG_LEVEL_PT_FALLBACK="1", ENABLE_CONSOLE="true", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"
    lines = proc.stderr.splitlines()
    assert lines.count("CPU fallback lgamma : self=HPUBFloat16Type") == 1
    table = lines.index("Frequency of op and op name that were executed on CPU:")
    assert lines[table + 1].split() == ["3", "aten::lgamma"]


def test_autocast_on_hpu_casts_by_gaudis_lists(device_mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    with gaudi.autocast(dtype=torch.bfloat16):  # Gaudi's lists on the CPU: the reference
        ref_out = model(x)
        ref_loss = F.cross_entropy(ref_out, y)
    model.to("hpu")
    with torch.autocast("hpu", dtype=torch.bfloat16):
        out = model(x.to("hpu"))
        loss = F.cross_entropy(out, y.to("hpu"))
    loss.backward()
    gaudi.mark_step()
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32  # linear: bf16; cross entropy: fp32
    torch.testing.assert_close(out.cpu(), ref_out)
    torch.testing.assert_close(loss.cpu(), ref_loss)
    assert model[0].weight.grad.dtype == torch.float32


def test_host_reads_flush_pending_lazy_work_and_are_reported(lazy):
    t = torch.ones(3, device="hpu")
    t.mul_(4)
    assert hd.current().recorder.pending()
    if t.sum() > 0:  # Python control flow on a device tensor: a host read
        value = t[0].item()
    assert value == 4.0 and not hd.current().recorder.pending()
    syncs = [s for s in hd.current().syncs if s[1].endswith(f"{os.path.basename(__file__)}:{_line('if t.sum')}")]
    assert syncs and syncs[0][2]  # it cut the pending graph, at the user's line


def _line(prefix: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip().startswith(prefix))


def test_torch_compile_on_device_tensors(device_mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    model.to("hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    x = torch.randn(5, 8)
    with torch.no_grad():
        model[0].bias.add_(1.0)  # pending in lazy mode: the compiled graph must read it
        reference[0].bias.add_(1.0)
    out = compiled(x.to("hpu"))
    out.sum().backward()
    reference(x).sum().backward()
    assert out.device.type == "hpu"
    torch.testing.assert_close(out.cpu(), reference(x))
    torch.testing.assert_close(model[0].weight.grad.cpu(), reference[0].weight.grad)


def test_pin_memory_loader_feeds_the_device(eager):
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    batches = [x.to("hpu", non_blocking=True) for x, _ in loader]
    torch.testing.assert_close(torch.cat(batches).cpu(), data.tensors[0])


def test_report_names_the_loop_constant_line_syncs_and_memory(lazy):
    steps = torch.arange(6.0, device="hpu")
    x = torch.zeros(3, device="hpu")
    for i in range(4):
        t_1 = steps[i]  # the docs' pattern: a new graph per iteration, the constant i in it
        x = x + t_1 * 2
        gaudi.mark_step()
    for _ in range(3):  # a steady loop: nothing new
        x = x * 0.5
        gaudi.mark_step()
    assert x.cpu().tolist() == [((0 + 2 + 4 + 6) / 8)] * 3
    report = hd.report()
    assert json.loads(json.dumps(report)) == report
    assert report["mode"] == "lazy" and report["target"] == "gaudi2"
    line = f"{os.path.basename(__file__)}:{_line('t_1 = steps[i]')}"
    loop = [r for r in report["recompiles"] if r["kind"] == "lazy graph" and line in r["cause"]]
    assert len(loop) >= 2 and all("a constant changed: aten.select.int argument 2" in r["cause"] for r in loop)
    assert all(s["recipes_compiled"] == 0 and not s["new_graphs"] for s in report["lazy_graph_steps"][-2:])
    assert any(s["source"].endswith(f":{_line('assert x.cpu()')}") for s in report["host_syncs"])
    assert 0 < report["memory"]["peak_bytes"] <= report["memory"]["hbm_bytes"]
    assert report["estimated_device_s_per_step"] > 0


def test_eager_ops_lower_once_per_layout_and_add_their_estimate(eager):
    def graphs():
        return sum(len(s.graphs) for s in gaudi.lazy_report())

    x = torch.randn(5, 7, device="hpu")
    start = graphs()
    y = torch.tanh(x) * 3
    lowered = graphs() - start
    z = torch.tanh(x) * 3  # the same ops on the same layouts: nothing lowered again
    assert lowered == 2 and graphs() - start == 2
    w = torch.randn(6, 7, device="hpu")
    before = graphs()
    torch.tanh(w)  # a new layout: lowered once more
    assert graphs() - before == 1
    torch.testing.assert_close(z.cpu(), y.cpu())
    torch.testing.assert_close(y.cpu(), torch.tanh(x.cpu()) * 3)
    steps = hd.report()["steps"]
    assert steps[-1]["estimated_device_s"] > 0


def test_strict_lazy_mode_refuses_the_graph_holding_a_fallback():
    from hpu_backend.lowering import LoweringError

    hd.enable("lazy", {"strict": True})
    try:
        y = torch.digamma(torch.rand(4, dtype=torch.bfloat16, device="hpu"))
        with pytest.raises(LoweringError, match="^CPU fallback of aten::digamma \\(bfloat16\\) in strict mode"):
            gaudi.mark_step()
        del y
    finally:
        hd.enable("eager")


def test_a_graph_compiled_for_another_target_leaves_the_devices_memory_target(eager):
    """The order dependence of the memory test above: a compiled graph for gaudi3 run earlier in the same process
    (tests/test_recompiles.py has one) moved the counters to gaudi3's HBM, so the OOM message said "gaudi3" once the
    test's eager ops were all known (no gaudi2 recipe ran to move it back)."""
    from hpu_backend.targets import device

    hpu = torch.hpu
    limit = hpu.memory_stats()["Limit"]
    assert limit == device("gaudi2").hbm_bytes
    doubled = torch.compile(lambda x: x * 2, backend="hpu_backend", options={"target": "gaudi3", "cache": False})
    torch.testing.assert_close(doubled(torch.ones(3)), torch.full((3,), 2.0))
    assert hpu.memory_stats()["Limit"] == limit and hpu.mem_get_info()[1] == limit
    current_context().memory.set_capacity(hpu.memory_allocated() + 10_000)
    with pytest.raises(torch.OutOfMemoryError, match=r"\(gaudi2 HBM, limited by"):
        torch.empty(1 << 20, device="hpu")
