"""The device behaves as a real device does where torch's clients lean on it: ``.data`` assignment and views of
flat buffers (DeepSpeed ZeRO), ``module.to`` of weakly referenced parameters, tensors made inside a compiled
graph, card indices, copies to and from the host, streams, threads and out-of-memory; each compared with the
same code on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch

import hpu_backend.device as hd

hd.enable("eager")  # before the process's first backward (see test_device.py)


def both(fn):
    """``fn(device)`` on the CPU and on the device, the device's result brought to the host."""
    want = fn("cpu")
    got = fn("hpu")
    return (got.cpu() if isinstance(got, torch.Tensor) else got), want


def test_data_assignment_moves_the_parameter_onto_the_new_values(device_mode):
    def run(device):
        p = torch.nn.Parameter(torch.zeros(3, device=device))
        p.data = torch.ones(3, device=device)
        return p.detach() * 2
    got, want = both(run)
    torch.testing.assert_close(got, want)


def test_a_parameter_made_a_view_of_a_flat_buffer_sees_the_buffers_updates(device_mode):
    """DeepSpeed ZeRO-1/2: every parameter's ``.data`` becomes a slice of one flat buffer the optimizer updates."""
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(device)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        offset = 0
        for p in model.parameters():
            p.data = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        flat.add_(0.5)  # the optimizer's step on the flat buffer
        return model(torch.ones(3, 4, device=device)).detach()
    got, want = both(run)
    torch.testing.assert_close(got, want)


def test_data_assignment_across_the_host_and_the_device_moves_the_tensor(device_mode):
    """DeepSpeed's AutoTP shards a CPU model's weights onto the card by ``param.data = shard.to(device)``, and
    older scripts write ``p.data = p.data.to(device)``: the same parameter object (its attributes, weak references
    to it and the module holding it) is then on the device with the shard's values, trains there as on the CPU,
    and moves back the same way."""
    def run(device):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        weight, fired = lin.weight, []
        weight.tp_rank = 1  # an attribute a client set on the parameter
        weakref.finalize(weight, lambda: fired.append(True))
        lin.weight.data = lin.weight.data[1:].to(device)  # this rank's shard of the output rows
        lin.bias.data = lin.bias.data[1:].to(device)
        assert lin.weight is weight and weight.device.type == device and weight.tp_rank == 1 and not fired
        assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad and weight.shape == (2, 4)
        out = lin(torch.ones(5, 4, device=device))
        out.square().sum().backward()
        torch.optim.SGD(lin.parameters(), lr=0.1).step()
        trained = weight.detach().clone()
        weight.data = weight.data.cpu()  # back to the host: the same object, a plain CPU parameter
        assert weight.device.type == "cpu" and type(weight) is torch.nn.Parameter and weight.tp_rank == 1
        return torch.cat([out.detach().cpu().flatten(), trained.cpu().flatten(), weight.detach().flatten()])
    got, want = both(run)
    torch.testing.assert_close(got, want)


RESHAPES = {
    "squeeze_": lambda x: x.squeeze_(),
    "unsqueeze_": lambda x: x.unsqueeze_(0),
    "t_": lambda x: x.t_(),
    "transpose_": lambda x: x.transpose_(0, 1),
    "as_strided_": lambda x: x.as_strided_((2,), (1,)),
    "resize_": lambda x: x.resize_(3, 2),
    "set_": lambda x: x.set_(torch.arange(6.0, device=x.device).view(3, 2)),
}


@pytest.mark.parametrize("name", list(RESHAPES))
def test_an_op_that_reshapes_a_tensor_in_place_changes_the_device_tensor(device_mode, name):
    """The op changes the tensor it is given (its shape, strides, memory) and returns it; later ops see the new
    layout, pending work on the old one included."""
    def run(device):
        x = torch.arange(2.0, device=device).reshape(2, 1) * 3  # pending in lazy mode
        y = RESHAPES[name](x)
        assert y is x
        if name == "resize_":
            x.view(-1)[2:] = 7.0  # the new elements' values are undefined until written
        return torch.cat([torch.tensor([float(s) for s in (*x.shape, *x.stride())]), (x + 1).cpu().flatten()])
    got, want = both(run)
    torch.testing.assert_close(got, want)


def test_a_parameter_set_to_its_shard_trains_the_shard():
    """FSDP's way of sharding a flat parameter: ``set_`` to this rank's slice, then train the parameter."""
    def run(device):
        flat = torch.nn.Parameter(torch.arange(8.0, device=device))
        with torch.no_grad():
            flat.set_(flat[4:].clone())
        assert flat.shape == (4,) and flat.is_leaf
        (flat * flat).sum().backward()
        return torch.cat([flat.detach().cpu(), flat.grad.cpu()])
    got, want = both(run)
    torch.testing.assert_close(got, want)


def test_module_to_moves_parameters_something_holds_weakly():
    lin = torch.nn.Linear(4, 4)
    fired = []
    weakref.finalize(lin.weight, lambda: fired.append(True))
    ref = weakref.ref(lin.bias)
    weight = lin.weight
    want = lin(torch.ones(2, 4)).detach()
    lin.to("hpu")
    assert lin.weight is weight and lin.weight.device.type == "hpu" and ref() is lin.bias
    assert isinstance(lin.weight, torch.nn.Parameter) and not fired
    torch.testing.assert_close(lin(torch.ones(2, 4, device="hpu")).detach().cpu(), want)


def test_module_to_moves_parameters_a_cpu_autograd_graph_still_holds():
    """A forward on the CPU, then ``module.to("hpu")`` with its graph still alive (a script that checks its model
    on the CPU first): the parameters move, as ``.data`` moves them on another device."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    x = torch.randn(2, 4)
    on_cpu = model(x)  # its autograd graph holds the weights
    model.to("hpu")
    assert all(p.device.type == "hpu" for p in model.parameters())
    torch.testing.assert_close(model(x.to("hpu")).detach().cpu(), on_cpu.detach())


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_compiled_graph_makes_tensors_on_the_device(device_mode, dynamic):
    """Every Hugging Face model makes ``position_ids`` with ``arange(n, device=x.device)`` inside its graph."""
    def fn(x):
        pos = torch.arange(x.shape[-1], device=x.device)
        empty = torch.tensor([], device=x.device)  # a literal in the graph (an empty KV cache)
        return x + pos, torch.ones(2, device=x.device) * x.shape[0], pos, torch.cat([empty, x.reshape(-1)]) * 2
    compiled = torch.compile(fn, backend="hpu_backend", dynamic=dynamic)
    for n in (5, 7):
        x = torch.randn(3, n)
        out = compiled(x.to("hpu"))
        assert all(t.device.type == "hpu" for t in out)
        for g, w in zip(out, fn(x)):
            torch.testing.assert_close(g.cpu(), w)


def test_a_compiled_graph_moves_a_constant_it_made_to_the_device(device_mode):
    """transformers' sliding-window cache makes ``torch.tensor(window)`` in the graph and moves it to
    ``x.device``: the move is traced as a device op (fake tensors cannot hold a device tensor as a constant)."""
    def fn(x):
        window = torch.tensor(3, dtype=torch.long).to(x.device)
        return torch.clamp(x, max=window), window + x.shape[-1]
    x = torch.arange(8.0).reshape(2, 4)
    out = torch.compile(fn, backend="hpu_backend")(x.to("hpu"))
    assert all(t.device.type == "hpu" for t in out)
    for g, w in zip(out, fn(x)):
        torch.testing.assert_close(g.cpu(), w)


def test_a_compiled_backward_takes_a_gradient_of_another_layout(device_mode):
    """A gradient whose size-1 dim has another stride than the traced one (Falcon's one-head KV cache): AOTAutograd
    restrides the device tensor's inner tensor in place, and the backward equals the CPU's."""
    def fn(x):
        return x.unsqueeze(1) * 2
    grads = []
    for device in ("cpu", "hpu"):
        x = torch.arange(8.0).reshape(2, 4).to(device).requires_grad_()
        grad = torch.empty_strided((2, 1, 4), (4, 1, 1)).copy_(torch.arange(8.0).reshape(2, 1, 4))
        torch.compile(fn, backend="hpu_backend")(x).backward(grad.to(device))
        grads.append(x.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


def test_inference_mode_reads_and_pends_as_outside_it(device_mode):
    """``torch.inference_mode()`` (serving code's choice over no_grad): autograd is off, so torch's composite ops
    reach the device undecomposed (``.cpu()`` is ``to``); they are decomposed as autograd would, and a lazy
    graph recorded in it fills its tensors at a ``mark_step`` after the block."""
    x = torch.arange(6.0).reshape(2, 3)
    weight = x.to("hpu")  # a normal tensor (a buffer made before the block): its views in the block are normal too
    with torch.inference_mode():
        view = weight[None, :, None].float().expand(2, 2, 4, 3)
        assert not view.is_inference()
        on_device = x.to("hpu") * 2
        cat = torch.cat([on_device, on_device]).to(torch.float64)
        host = cat.cpu()
        kept = on_device + 1
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    torch.testing.assert_close(host, torch.cat([x * 2, x * 2]).to(torch.float64))
    from hpu_backend import gaudi

    gaudi.mark_step()  # in lazy mode, the graph recorded in the block runs now, outside it
    torch.testing.assert_close(kept.cpu(), x * 2 + 1)
    torch.testing.assert_close(view.cpu(), x[None, :, None].expand(2, 2, 4, 3))
    assert kept.is_inference()


def test_a_backward_reads_the_index_tensor_its_forward_made_on_the_device_without_a_host_read(device_mode):
    """Position embeddings of ``arange(n, device=x.device)``: the forward saves the index tensor it made for its
    backward (an embedding's gradient), which gets it as a device tensor. The gradients equal the CPU's, and
    reading it is no host read (on a Gaudi it never leaves the device)."""
    torch.manual_seed(0)
    on_cpu = torch.nn.Embedding(16, 4)
    on_hpu = torch.nn.Embedding(16, 4)
    on_hpu.load_state_dict(on_cpu.state_dict())
    on_hpu.to("hpu")

    def loss(emb, x):
        return (emb(torch.arange(x.shape[0], device=x.device)) * x).sum()
    x = torch.randn(8, 4)
    loss(on_cpu, x).backward()
    before = len(hd.current().syncs)
    torch.compile(loss, backend="hpu_backend")(on_hpu, x.to("hpu")).backward()
    assert hd.current().syncs[before:] == []
    torch.testing.assert_close(on_hpu.weight.grad.cpu(), on_cpu.weight.grad)


def test_a_recomputed_block_reads_a_mask_its_forward_made_on_the_device(device_mode):
    """Activation checkpointing in a compiled graph (Hugging Face's ``gradient_checkpointing_enable``): the causal
    mask made on the device outside the block is saved for the backward, which recomputes the block's attention
    from it. Its gradients equal the CPU's in both modes (in lazy mode the backward's ops on the saved device
    tensor went back through the device and read a value not computed yet)."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    proj, emb = torch.nn.Linear(64, 192), torch.nn.Embedding(10, 64)

    def block(x, mask):
        q, k, v = (t.view(2, 16, 4, 16).transpose(1, 2) for t in proj(x).chunk(3, -1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(2, 16, 64) + x

    def loss(ids):
        h = emb(ids)
        i = torch.arange(16, device=h.device)
        mask = (i[None, :] <= i[:, None])[None, None].expand(2, 1, 16, 16)
        return checkpoint(block, h, mask, use_reentrant=False).pow(2).mean()
    ids = torch.randint(0, 10, (2, 16), generator=torch.Generator().manual_seed(0))
    loss(ids).backward()
    want = [p.grad.clone() for p in (*proj.parameters(), *emb.parameters())]
    for p in (*proj.parameters(), *emb.parameters()):
        p.grad = None
    proj.to("hpu"), emb.to("hpu")
    torch.compile(loss, backend="hpu_backend")(ids.to("hpu")).backward()
    for have, w in zip((p.grad for p in (*proj.parameters(), *emb.parameters())), want):
        torch.testing.assert_close(have.cpu(), w)


def test_a_compiled_graph_writes_a_tensor_it_made_on_the_device():
    """Attention masks are made in the graph and written in place with a device mask (``zeros(..., device=)``,
    then ``masked_fill_``): the write reaches the tensor the graph goes on reading, in the forward and backward."""
    def fn(x, mask):
        bias = torch.zeros(x.shape, device=x.device)
        bias.masked_fill_(mask, -3.0)
        bias[0] += x[0]
        return (x * 2 + bias).softmax(-1)
    x = torch.randn(3, 4)
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.5
    want_x = x.clone().requires_grad_()
    want = fn(want_x, mask)
    w = torch.randn(3, 4)
    (want * w).sum().backward()
    got_x = x.to("hpu").requires_grad_()
    got = torch.compile(fn, backend="hpu_backend")(got_x, mask.to("hpu"))
    (got * w.to("hpu")).sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach())
    torch.testing.assert_close(got_x.grad.cpu(), want_x.grad)


def test_a_process_uses_one_card_whatever_index_names_it_and_a_missing_card_is_refused(monkeypatch):
    """DeepSpeed's rank 1 calls set_device(1) and makes its tensors on ``hpu:1``: they are the process's card,
    and a backward runs on them (torch's autograd engine queues a Python backend's work for one device)."""
    monkeypatch.setenv("HPU_SIM_CARDS", "3")
    torch.hpu.set_device(1)
    made = [torch.zeros(2).to("hpu"), torch.zeros(2, device="hpu"), torch.zeros(2).hpu(),
            torch.zeros(2, device="hpu:1"), torch.ones(2).to("hpu:2"), torch.randn(2, device="hpu:0")]
    assert {str(t.device) for t in made} == {"hpu:0"} and torch.hpu.current_device() == 0
    x = torch.ones(2, device="hpu:1", requires_grad=True)
    (x * 3).sum().backward()
    assert x.grad.cpu().tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="hpu device 3 does not exist: device_count\\(\\) is 3"):
        torch.zeros(2, device="hpu:3")
    with pytest.raises(RuntimeError, match="hpu device 5 does not exist"):
        torch.hpu.set_device(5)


def test_host_tensor_written_in_place_from_a_device_one_is_refused(device_mode):
    c = torch.zeros(3)
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, cpu and hpu:0"):
        c.add_(torch.ones(3, device="hpu"))
    c.copy_(torch.ones(3, device="hpu"))  # a copy is how a value comes back
    assert c.tolist() == [1.0, 1.0, 1.0]


def test_numpy_force_copies_and_dlpack_shares_both_ways(device_mode):
    t = torch.arange(3.0, device="hpu") * 2  # pending in lazy mode: the export runs it first
    assert t.numpy(force=True).tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(TypeError, match="Tensor.cpu"):
        t.numpy()
    shared = torch.from_dlpack(t)  # the device's memory is the host's: shared, as DLPack shares
    assert shared.device.type == "cpu" and shared.tolist() == [0.0, 2.0, 4.0]
    shared.add_(1)
    assert t.cpu().tolist() == [1.0, 3.0, 5.0]
    back = torch.from_dlpack(torch.utils.dlpack.to_dlpack(torch.ones(2))).to("hpu")  # an import, then to the device
    assert back.device.type == "hpu" and back.cpu().tolist() == [1.0, 1.0]


def test_record_stream_takes_a_device_stream():
    s = torch.hpu.Stream()
    assert isinstance(s, torch.Stream) and s.device.type == "hpu"
    t = torch.ones(3, device="hpu")
    t.record_stream(s)
    assert (t * 2).cpu().tolist() == [2.0, 2.0, 2.0]


def test_threads_share_the_device(device_mode):
    results, errors = {}, []

    def work(i):
        try:
            x = torch.full((4,), float(i), device="hpu")
            for _ in range(5):
                x = x * 2 + 1
            results[i] = x.cpu()
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(12):
        want = torch.full((4,), float(i))
        for _ in range(5):
            want = want * 2 + 1
        torch.testing.assert_close(results[i], want)


def test_a_request_past_the_hbm_is_the_devices_out_of_memory_error():
    with pytest.raises(torch.OutOfMemoryError, match="hpu out of memory: tried to allocate 1024.00 GiB"):
        torch.empty(1 << 40, dtype=torch.uint8, device="hpu")
    with pytest.raises(torch.OutOfMemoryError, match="hpu out of memory"):
        torch.zeros(1 << 38, device="hpu")


def _raising_backward(device: str, where: str) -> torch.Tensor:
    """A backward that raises from inside torch's autograd engine, at ``where``."""
    x = torch.arange(4.0, device=device, requires_grad=True)
    if where == "tensor hook":
        y = x * 2
        y.register_hook(lambda grad: grad * {}["scale"])  # KeyError
        return y.sum()
    if where == "saved-tensor hook":
        def unpack(saved):
            raise ValueError(f"cannot unpack a tensor of shape {list(saved.shape)}")
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            return (x * x).sum()
    # activation checkpointing whose recomputation fails (a layer called differently the second time)
    calls = []

    def layer(t):
        calls.append(1)
        if len(calls) > 1:
            raise TypeError("the layer's recomputation got other arguments")
        return torch.relu(t) * t
    return torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False).sum()


@pytest.mark.parametrize("where", ["tensor hook", "saved-tensor hook", "checkpoint recomputation"])
def test_an_exception_inside_a_backward_is_raised_by_backward_as_on_the_cpu(device_mode, where):
    """torch calls the Python device guard while unwinding from such an exception; it once aborted the process
    ("terminate called without an active exception"). Now ``backward()`` raises it, and the device goes on."""
    def run(device):
        with pytest.raises(Exception) as failed:
            _raising_backward(device, where).backward()
        x = torch.ones(3, device=device, requires_grad=True)
        (x * 3).sum().backward()  # the next backward runs
        return type(failed.value), str(failed.value), x.grad.cpu()
    (got_type, got_text, got_grad), (want_type, want_text, want_grad) = both(run)
    assert (got_type, got_text) == (want_type, want_text)
    torch.testing.assert_close(got_grad, want_grad)


def test_running_out_of_device_memory_in_a_backward_is_the_out_of_memory_error(device_mode):
    from hpu_backend.device.context import current_context

    x = torch.randn(256, 256, device="hpu", requires_grad=True)
    w = torch.randn(256, 256, device="hpu", requires_grad=True)
    loss = (x @ w).relu().square().sum()
    torch.hpu.synchronize()
    memory = current_context().memory
    memory.set_capacity(torch.hpu.memory_allocated() + 64 * 1024)  # no room for a 256 KiB gradient
    try:
        with pytest.raises(torch.OutOfMemoryError, match="hpu out of memory: tried to allocate 256.00 KiB"):
            loss.backward()
            torch.hpu.synchronize()
    finally:
        memory.set_capacity(None)
    y = torch.ones(3, device="hpu", requires_grad=True)
    (y * 3).sum().backward()
    assert y.grad.cpu().tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("release, lazy, mode", [
    ("", "", "eager"), ("1.21", "", "eager"), ("1.20.0", "", "lazy"), ("1.22.0", "1", "lazy"), ("1.19", "0", "eager")])
def test_the_mode_follows_the_simulated_release_unless_set(monkeypatch, release, lazy, mode):
    from hpu_backend.device import release as releases

    monkeypatch.setenv("HPU_SIM_RELEASE", release)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    assert releases.mode_from_env() == mode


@pytest.mark.parametrize("name, value, words", [
    ("PT_HPU_LAZY_MODE", "2", "PT_HPU_LAZY_MODE='2': use 1 (lazy mode) or 0"),
    ("PT_HPU_LAZY_MODE", "banana", "PT_HPU_LAZY_MODE='banana'"),
    ("HPU_SIM_RELEASE", "2.0", "HPU_SIM_RELEASE='2.0': not a Gaudi software release"),
])
def test_a_bad_mode_or_release_is_one_line(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(hd.DeviceSetupError) as e:
        hd.enable()
    assert words in str(e.value) and "\n" not in str(e.value)


def _run_script(tmp_path, text: str, *launcher: str, **env: str):
    """``text`` as a real script, run by Python (or by the launcher, with its options): the finished process."""
    root = Path(__file__).resolve().parent.parent
    script = tmp_path / "script.py"
    script.write_text(text)
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "cli")]), **env)
    command = [sys.executable, *(["-m", "hpurecipe.main", "run", *launcher] if launcher else []), str(script)]
    return subprocess.run(command, capture_output=True, text=True, env=full, timeout=300, cwd=tmp_path)


@pytest.mark.e2e
def test_a_data_loader_with_workers_feeds_the_device_without_cache_errors(tmp_path, monkeypatch):
    """Forked DataLoader workers inherit the recipe cache's lock objects: each process takes its own."""
    monkeypatch.delenv("PT_HPU_RECIPE_CACHE_CONFIG",
                       raising=False)  # the default cache under HOME, as a user's run has it
    done = _run_script(tmp_path, (
        "import torch, hpu_backend.device as hd\n"
        "hd.enable('lazy')\n"
        "from hpu_backend import gaudi\n"
        "ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(8, 2).to('hpu')\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x.to('hpu')), y.to('hpu'))\n"
        "    loss.backward(); gaudi.mark_step(); opt.step(); opt.zero_grad(); gaudi.mark_step()\n"
        "print('loss', loss.item())\n"), HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loss" in done.stdout
    assert "background job failed" not in done.stderr and "inherited across fork" not in done.stderr


@pytest.mark.e2e
def test_every_rank_of_a_two_card_run_trains_on_its_card(tmp_path):
    """As DeepSpeed's HPU accelerator does: set_device(LOCAL_RANK), tensors on ``hpu:{LOCAL_RANK}``, a backward."""
    done = _run_script(tmp_path, (
        "import os, torch\n"
        "import habana_frameworks.torch.core  # noqa: F401\n"
        "rank = int(os.environ['LOCAL_RANK'])\n"
        "torch.hpu.set_device(rank)\n"
        "x = torch.ones(2, device=f'hpu:{rank}', requires_grad=True)\n"
        "(x * (rank + 2)).sum().backward()\n"
        "print('grad', rank, x.grad.cpu().tolist())\n"), "--cards", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "grad 0 [2.0, 2.0]" in done.stdout and "grad 1 [3.0, 3.0]" in done.stdout


FSDP_SCRIPT = """
import gc, json, os, torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard

def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 16, generator=g), torch.randn(4, 4, generator=g)

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

dist.init_process_group("hccl")
rank = dist.get_rank()
torch.hpu.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("hpu", torch.hpu.current_device())
WRAP
opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
losses, memory = [], []
for step in range(4):
    x, y = batch(rank, step)
    loss = torch.nn.functional.mse_loss(fsdp(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
    gc.collect()  # what the step holds, not what awaits the collector
    memory.append(torch.hpu.memory_allocated())
weight = first_weight().detach().cpu().tolist()
with open(f"rank{rank}.json", "w") as f:  # a file each: the ranks' prints can share a line
    json.dump({"losses": losses, "weight": weight, "memory": memory}, f)
"""


# torch's FSDP (a flat parameter per wrapped module) and its per-parameter successor, fully_shard (FSDP2).
WRAPS = {
    "FSDP": "fsdp = FSDP(model().to(device), device_id=device, use_orig_params={orig})\n"
            "def first_weight():\n"
            "    with FSDP.summon_full_params(fsdp):\n"
            "        return fsdp.module[0].weight.clone()",
    "fully_shard": "fsdp = model().to(device)\n"
                   "fully_shard(fsdp[0]); fully_shard(fsdp[2]); fully_shard(fsdp)\n"
                   "def first_weight():\n"
                   "    return fsdp[0].weight.full_tensor()",
}


@pytest.mark.e2e
@pytest.mark.parametrize("lazy, wrap, use_orig_params", [("0", "FSDP", True), ("1", "FSDP", False),
                                                         ("1", "fully_shard", None)])
def test_fsdp_over_two_cards_trains_as_one_cpu_process_with_both_batches(tmp_path, lazy, wrap, use_orig_params):
    """torch's FSDP frees each unsharded flat parameter after use and restores it for the next by resizing its
    storage: the device's storage is the host's, resizable (pending lazy work done first), and the device's memory
    count follows the resizes."""
    script = FSDP_SCRIPT.replace("WRAP", WRAPS[wrap].format(orig=use_orig_params))
    done = _run_script(tmp_path, script, "--cards", "2", PT_HPU_LAZY_MODE=lazy)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    namespace = {}
    exec(FSDP_SCRIPT.split("dist.init_process_group")[0], namespace)  # batch() and model(), on the CPU
    reference = namespace["model"]()
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for step in range(4):  # both ranks' batches in one: equal shards, so the mean of the ranks' losses
        x, y = zip(*(namespace["batch"](rank, step) for rank in (0, 1)))
        loss = torch.nn.functional.mse_loss(reference(torch.cat(x)), torch.cat(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.testing.assert_close((ranks[0]["losses"][step] + ranks[1]["losses"][step]) / 2, loss.item(),
                                   rtol=1e-5, atol=1e-6)
    weights = sum(p.numel() * p.element_size() for p in reference.parameters())
    # What a step ends holding may differ by one rank's shard (a gradient shard the reduce-scatter has or has not
    # released yet), never grow step by step, and stay below the unsharded training state (weights, gradients
    # and AdamW's two moments).
    shard = -(-weights // 2)
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["weight"]), reference[0].weight.detach(), rtol=1e-5, atol=1e-6)
        memory = r["memory"]
        assert max(memory) - min(memory) <= shard and max(memory) < 0.75 * 4 * weights, (memory, weights)

