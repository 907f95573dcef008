"""The hpu device: a Gaudi-style training script runs unchanged on ``torch.device("hpu")`` in eager and lazy modes,
and its losses, weights and checkpoints match the same script on the CPU."""

from __future__ import annotations

import copy
import io

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


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Linear(32, 10), nn.LogSoftmax(dim=1))


def train(make, device: str, steps: int = 5, optimizer: str = "sgd"):
    """A Gaudi-style loop: model and batches moved to ``device``, mark_step after backward and after step."""
    torch.manual_seed(0)
    model = make().to(device)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        images, labels = torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)
        images, labels = images.to(device), labels.to(device)
        opt.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        gaudi.mark_step()
        opt.step()
        gaudi.mark_step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.e2e
@pytest.mark.parametrize("make, optimizer", [(TinyCNN, "sgd"), (mlp, "adamw")])
def test_training_matches_the_cpu(device_mode, make, optimizer):
    cpu_losses, cpu_model = train(make, "cpu", optimizer=optimizer)
    losses, model = train(make, "hpu", optimizer=optimizer)
    torch.testing.assert_close(losses, cpu_losses)
    for (name, p), (_, q) in zip(model.named_parameters(), cpu_model.named_parameters()):
        assert p.device.type == "hpu" and p.grad.device.type == "hpu", name
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=name)


def test_lazy_mode_cuts_graphs_at_mark_step_and_reuses_them():
    hd.enable("lazy")
    try:
        report = gaudi.lazy_report()  # the latest steps only: marked by step index, not by its length
        before = report[-1].index if report else -1
        train(mlp, "hpu", steps=4)
        steps = [s for s in gaudi.lazy_report() if s.index > before]
    finally:
        hd.enable("eager")
    assert sum(len(s.graphs) for s in steps) >= 8  # backward and step graphs of every iteration
    assert all(g.cut_by == "mark_step" for s in steps[2:] for g in s.graphs)
    assert all(not g.new for s in steps[-4:] for g in s.graphs)  # the steady state runs graphs seen before


def test_views_in_place_and_host_reads(device_mode):
    base = torch.arange(12.0).reshape(3, 4)
    t = base.to("hpu")
    row = t[1]
    row.mul_(10)  # through a view: the base sees it
    t.t()[0].add_(1)
    base[1].mul_(10)
    base.t()[0].add_(1)
    assert t.device.type == "hpu" and row.device.type == "hpu"
    assert t.tolist() == base.tolist()
    assert float(t.sum()) == float(base.sum()) and bool((t > 5).any())
    assert t[2, 3].item() == base[2, 3].item()
    torch.testing.assert_close(t.cpu().numpy(), base.numpy())
    assert "device='hpu:0'" in repr(t)


def test_factories_seed_the_device_generator_like_the_cpu(device_mode):
    torch.manual_seed(7)
    a = torch.randn(5, device="hpu")
    torch.manual_seed(7)
    b = torch.randn(5, device="hpu")
    torch.manual_seed(7)
    c = torch.randn(5)
    torch.testing.assert_close(a.cpu(), b.cpu())
    torch.testing.assert_close(a.cpu(), c)
    z = torch.zeros(2, 3, device="hpu", dtype=torch.bfloat16)
    assert z.device.type == "hpu" and z.dtype == torch.bfloat16 and z.cpu().abs().sum().item() == 0
    assert torch.tensor([1, 2], device="hpu").cpu().tolist() == [1, 2]
    assert torch.arange(4, device="hpu").sum().item() == 6


def test_checkpoint_holds_the_values_after_the_step(device_mode, tmp_path):
    _, model = train(mlp, "hpu", steps=2)
    x = torch.randn(4, 1, 12, 12)
    with torch.no_grad():
        model[1].weight.add_(1.0)  # pending in lazy mode: the save must flush it
    path = tmp_path / "ckpt.pt"
    torch.save(model.state_dict(), path)
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    loaded = torch.load(path)  # weights_only, back on the device
    assert all(v.device.type == "hpu" for v in loaded.values())
    on_cpu = torch.load(path, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu.values())
    for k in expected:
        torch.testing.assert_close(loaded[k].cpu(), expected[k])
        torch.testing.assert_close(on_cpu[k], expected[k])
    fresh = mlp().to("hpu")
    fresh.load_state_dict(torch.load(path, map_location="hpu"))
    torch.testing.assert_close(fresh(x.to("hpu")).cpu(), model(x.to("hpu")).cpu())
    buffer = io.BytesIO()
    torch.save(model[1].weight, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer).cpu(), expected["1.weight"])


def test_torch_hpu_module():
    hpu = hd.enable("eager")
    assert torch.hpu is hpu and hpu.is_available() and hpu.device_count() >= 1
    assert hpu.get_device_name() in ("GAUDI2", "GAUDI3") and hpu.is_bf16_supported()
    t = torch.ones(3).hpu()
    assert t.is_hpu if hasattr(t, "is_hpu") else t.device.type == "hpu"
    assert nn.Linear(2, 2).hpu().weight.device.type == "hpu"
    hpu.synchronize()


def test_streams_events_and_properties_a_timing_script_uses():
    hpu = hd.enable("eager")
    start, end = hpu.Event(enable_timing=True), hpu.Event(enable_timing=True)
    start.record()
    torch.ones(8, device="hpu").sum().item()
    end.record()
    end.synchronize()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    with hpu.stream(hpu.current_stream()):
        hpu.current_stream().synchronize()
    props = hpu.get_device_properties(0)
    assert props.name == hpu.get_device_name() and props.total_memory == hpu.mem_get_info()[1]


def test_gradients_accumulate_over_backward_passes_as_on_the_cpu(device_mode):
    torch.manual_seed(3)
    reference = nn.Linear(4, 3)
    model = nn.Linear(4, 3)
    model.load_state_dict(reference.state_dict())
    model.to("hpu")
    xs = [torch.randn(2, 4) for _ in range(3)]
    for x in xs:  # no zero_grad: the second and third backward add into .grad
        reference(x).pow(2).sum().backward()
        model(x.to("hpu")).pow(2).sum().backward()
    gaudi.mark_step()
    torch.testing.assert_close(model.weight.grad.cpu(), reference.weight.grad)
    torch.testing.assert_close(model.bias.grad.cpu(), reference.bias.grad)


def test_a_deepcopy_of_pending_work_holds_its_values(device_mode):
    """``copy.deepcopy`` of a tensor computed since the last mark_step (a model copied for EMA or evaluation) holds
    the computed values, never the unfilled host bytes; a deep-copied parameter keeps its gradient and flag."""
    x = torch.arange(6.0).reshape(2, 3).to("hpu").requires_grad_()
    (x * 2).sum().backward()
    pending = x * 3 + 1
    copied = copy.deepcopy(pending)
    twin = copy.deepcopy(x)
    torch.testing.assert_close(copied.cpu(), torch.arange(6.0).reshape(2, 3) * 3 + 1)
    assert copied.device.type == "hpu" and twin.requires_grad and twin.is_leaf
    torch.testing.assert_close(twin.grad.cpu(), torch.full((2, 3), 2.0))
    model = nn.Linear(3, 2).to("hpu")
    torch.testing.assert_close(copy.deepcopy(model).weight.cpu(), model.weight.cpu())


def test_an_hpu_graph_of_a_parametrized_device_module_replays_and_sees_weight_updates(device_mode):
    """``weight_norm`` (a parametrization, as in wav2vec2's positional convolution) on the device: the capture
    exports the module's inner state, so torch's unwrapping of subclass parameters does not meet the
    parametrization twice; the replay binds the device module's own parameters."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 4)).eval()
    x = torch.randn(3, 8)
    model = gaudi.wrap_in_hpu_graph(copy.deepcopy(cpu).to("hpu"))
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x.to("hpu")).cpu(), cpu(x))
        assert [g is not None for g in model.forward.graphs.values()] == [True]  # replayed, not run eagerly
        for m in (cpu, model):
            m[0].parametrizations.weight.original1.mul_(0.5)
        torch.testing.assert_close(model(x.to("hpu")).cpu(), cpu(x))
