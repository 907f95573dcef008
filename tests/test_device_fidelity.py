"""What the hpu device reports matches what Gaudi does: the ops Gaudi runs are not CPU fallbacks, and attention
is one fused device op — each compared with the same code on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hpu_backend.device as hd

hd.enable("eager")  # before any backward of the process (see test_device.py)
from hpu_backend import gaudi  # noqa: E402
from hpu_backend.lowering import optable  # noqa: E402

# Ops on Intel's supported list that the device used to send to the CPU, and the torch calls that reach them.
GAUDI_OPS = ("stack", "mse_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits", "multinomial",
             "_unique2", "select_backward", "zero", "lift_fresh")


def _script(device: str) -> list[torch.Tensor]:
    """One call of each op in GAUDI_OPS, on ``device``; the results on the CPU."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3).to(device), torch.randn(4, 3).to(device)
    w = torch.randn(4, 3).to(device).requires_grad_()
    (w[1] * 2).sum().backward()  # select_backward
    z = torch.ones(3).to(device)
    z.zero_()
    out = [torch.stack([x, y]), F.mse_loss(x, y), F.smooth_l1_loss(x, y),
           F.binary_cross_entropy_with_logits(x, (y > 0).float()), torch.multinomial(x.softmax(-1), 2),
           torch.unique(torch.tensor([3, 1, 3, 2]).to(device)), w.grad, z,
           torch.tensor([1.0, 2.0], device=device) + x[0, :2]]  # torch.tensor(..., device=) lifts a fresh tensor
    gaudi.mark_step()
    return [t.detach().cpu() for t in out]


def _fallback_ops() -> set[str]:
    return {optable.packet_name(f["op"]) for f in hd.report()["cpu_fallbacks"]}


def test_ops_gaudi_runs_are_in_the_op_table():
    table = optable.shared_table()
    assert [op for op in GAUDI_OPS if table.lookup(op) is None] == []


def test_ops_gaudi_runs_are_not_reported_as_cpu_fallbacks(device_mode):
    expected = _script("cpu")
    got = _script("hpu")
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want)
    reported = _fallback_ops()
    assert not reported & {*GAUDI_OPS, "zero_", "unique"}, reported


def test_a_float64_op_falls_back_and_the_report_names_its_dtype(device_mode):
    """Gaudi has no float64 kernels: DeepSpeed's gradient norms (its accelerator reports fp64) run on the CPU, and
    the report says why (the dtype), in lazy mode too, where the fallback is a node of a recipe."""
    x = torch.arange(6.0).to("hpu")
    norm = torch.linalg.vector_norm(x.to(torch.float64))
    gaudi.mark_step()
    torch.testing.assert_close(norm.cpu(), torch.linalg.vector_norm(torch.arange(6.0, dtype=torch.float64)))
    rows = {optable.packet_name(f["op"]): f for f in hd.report()["cpu_fallbacks"]}
    assert "linalg_vector_norm" in rows and rows["linalg_vector_norm"]["dtypes"], rows
    assert any("64" in d or "Double" in d for d in rows["linalg_vector_norm"]["dtypes"]), rows


def test_a_metadata_check_is_no_cpu_fallback(device_mode):
    """``_assert_tensor_metadata`` (what torch.export leaves for ``.to(dtype)``, so every HPU-graph replay runs it)
    checks a tensor's dtype on the host: no kernel, no fallback; a wrong dtype fails as on the CPU."""
    x = torch.ones(2, device="hpu")
    torch.ops.aten._assert_tensor_metadata(x, dtype=torch.float32)
    gaudi.mark_step()
    assert "_assert_tensor_metadata" not in _fallback_ops()
    with pytest.raises(RuntimeError):
        torch.ops.aten._assert_tensor_metadata(x, dtype=torch.int64)
        gaudi.mark_step()


def _by_hand(q, k, v):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


ATTENTION = {
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "fused_sdpa": lambda q, k, v: gaudi.FusedSDPA.apply(q, k, v, None, 0.0, True),
    "by_hand": _by_hand,
}


def _attention_step(name: str, device: str, shape=(1, 2, 16, 8), dtype=torch.float32):
    """Forward and backward of one attention; (output, gradients) on the CPU."""
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(shape, generator=g, dtype=dtype).to(device).requires_grad_() for _ in range(3)]
    out = ATTENTION[name](*leaves)
    out.float().sum().backward()
    gaudi.mark_step()
    return [t.detach().cpu() for t in (out, *(x.grad for x in leaves))]


@pytest.mark.parametrize("name", ["sdpa", "fused_sdpa"])
def test_attention_on_the_device_is_the_cpu_fused_kernel_exactly(device_mode, name):
    for want, have in zip(_attention_step(name, "cpu"), _attention_step(name, "hpu")):
        torch.testing.assert_close(have, want, rtol=0, atol=0)
    assert not _fallback_ops() & {"_safe_softmax", "_scaled_dot_product_flash_attention_for_cpu"}


@pytest.mark.parametrize("boolean", [False, True])
def test_masked_attention_on_the_device_is_the_cpu_fused_kernel_exactly(device_mode, boolean):
    """A boolean mask is made additive as torch makes it for the CPU's fused kernel."""
    g = torch.Generator().manual_seed(0)
    mask = torch.randn(16, 16, generator=g)
    mask = mask > 0 if boolean else mask

    def run(device):
        leaves = [torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(i)).to(device).requires_grad_()
                  for i in range(3)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask.to(device))
        out.sum().backward()
        gaudi.mark_step()
        return [t.detach().cpu() for t in (out, *(x.grad for x in leaves))]

    for want, have in zip(run("cpu"), run("hpu")):
        torch.testing.assert_close(have, want, rtol=0, atol=0)


def test_the_math_path_of_sdpa_runs_on_the_device_too(device_mode):
    """Where the CPU takes torch's math path (3-d inputs), so does the device: its _safe_softmax on the device."""
    q = torch.randn(2, 8, 4)
    want = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    have = F.scaled_dot_product_attention(*(q.to("hpu") for _ in range(3)), is_causal=True)
    gaudi.mark_step()
    torch.testing.assert_close(have.cpu(), want)
    assert "_safe_softmax" not in _fallback_ops()


@pytest.mark.parametrize("shape, gqa", [((2, 8, 4), False), ((1, 4, 8, 4), True)])
def test_the_math_path_takes_a_boolean_mask_as_torch_does(device_mode, shape, gqa):
    """3-d inputs and grouped K/V heads take the math path, which adds its mask to the scores: a boolean mask is
    made additive first (-inf where False), as torch does (added as 0/1, it was no mask at all)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g)
    kv = torch.randn(shape[:-3] + (shape[-3] // 2, *shape[-2:]) if gqa else shape, generator=g)
    mask = torch.ones(shape[-2], shape[-2], dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=gqa)
    have = F.scaled_dot_product_attention(q.to("hpu"), kv.to("hpu"), kv.to("hpu"), attn_mask=mask.to("hpu"),
                                          enable_gqa=gqa)
    gaudi.mark_step()
    torch.testing.assert_close(have.cpu(), want)


def test_compiled_attention_with_a_boolean_mask_equals_the_cpu(device_mode):
    """Under torch.compile the device's attention is traced with its math path (a transformers model makes its
    causal mask explicit when compiled): the boolean mask must stay a mask there too."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()[None, None].expand(2, 1, 16, 16)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    attend = torch.compile(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]), backend="hpu_backend")
    have = attend(q.to("hpu"), k.to("hpu"), v.to("hpu"), mask.to("hpu"))
    torch.testing.assert_close(have.cpu(), want)


def _estimated_s() -> float:
    """The device seconds the report has estimated so far (over every step)."""
    return sum(step["estimated_device_s"] for step in hd.report()["steps"])


def _step_estimates(names, shape) -> tuple[dict[str, float], dict[str, int]]:
    """The report's estimated device seconds of one lazy step (forward and backward) of each attention, and the
    peak device memory of each step."""
    hd.enable("lazy")
    estimates, peaks = {}, {}
    try:
        for name in names:
            gaudi.reset_peak_memory_stats()
            before = _estimated_s()
            _attention_step(name, "hpu", shape, torch.bfloat16)
            estimates[name], peaks[name] = _estimated_s() - before, gaudi.max_memory_allocated()
    finally:
        hd.enable("eager")
    return estimates, peaks


def test_fused_attention_is_estimated_no_slower_and_no_larger_than_attention_by_hand():
    (batch, heads, seq, dim) = shape = (2, 4, 256, 64)
    estimates, peaks = _step_estimates(["sdpa", "fused_sdpa", "by_hand"], shape)
    assert all(v > 0 for v in estimates.values()), estimates
    assert estimates["sdpa"] <= estimates["by_hand"] and estimates["fused_sdpa"] <= estimates["by_hand"], estimates
    scores = batch * heads * seq * seq * 2  # one bf16 S×S matrix: the hand-written attention keeps it for backward
    assert peaks["sdpa"] + scores <= peaks["by_hand"] and peaks["fused_sdpa"] + scores <= peaks["by_hand"], peaks


OPTIMIZERS = {"FusedAdamW": lambda params: gaudi.FusedAdamW(params, lr=0.01, weight_decay=0.01),
              "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),  # foreach: torch's default on hpu
              "AdamW per parameter": lambda params: torch.optim.AdamW(params, lr=0.01, foreach=False)}


def test_optimizers_take_their_foreach_path_on_the_device_as_on_a_gaudi():
    """Gaudi's tensors are plain tensors of a foreach device (PrivateUse1), so torch's optimizers and
    clip_grad_norm_ default to their foreach kernels there: a dozen ops a step, not a dozen per parameter."""
    from torch.optim.optimizer import _default_to_fused_or_foreach
    from torch.utils._foreach_utils import _has_foreach_support

    params = list(torch.nn.Linear(4, 4).to("hpu").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (False, True)
    assert _has_foreach_support(params, torch.device("hpu"))
    cpu = list(torch.nn.Linear(4, 4).parameters())
    assert _default_to_fused_or_foreach(cpu, differentiable=False, use_fused=False) == (False, False)


def _train(device: str, optimizer: str, steps: int = 6) -> tuple[list[float], list[torch.Tensor]]:
    """A Gaudi-style loop: mark_step after backward and after the optimizer step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    opt = OPTIMIZERS[optimizer](model.parameters())
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g).to(device), torch.randn(4, 2, generator=g).to(device)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        gaudi.mark_step()
        opt.step()
        gaudi.mark_step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_adamw_step_values_are_device_tensors_and_the_lazy_step_stops_compiling(optimizer):
    """With the step size and bias corrections as Python floats, every optimizer step was a new lazy graph:
    FusedAdamW takes them as device tensors (torch's capturable step); torch's AdamW passes floats, which the
    lazy recorder makes graph inputs once they change from one step to the next."""
    losses, weights = _train("cpu", optimizer)
    hd.enable("lazy")
    try:
        before = len(hd.report()["lazy_graph_steps"])
        got_losses, got_weights = _train("hpu", optimizer)
        steps = hd.report()["lazy_graph_steps"][before:]
    finally:
        hd.enable("eager")
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses))  # float32 losses, float32 tolerance
    for want, have in zip(weights, got_weights):
        torch.testing.assert_close(have, want)
    steady = steps[4:12]  # loop iterations 3 to 6 (a step ends at each of their two mark_step calls)
    assert len(steady) == 8 and all(s["graphs"] for s in steady), steps
    assert [g for s in steady for g in s["new_graphs"]] == [] and sum(s["recipes_compiled"] for s in steady) == 0


def test_fused_sdpa_recompute_choice_reaches_the_device_recipe():
    """recompute_mode=False saves the probabilities for the backward (HBM traffic the estimate charges);
    None takes the process-wide default, recompute, as on Gaudi."""
    estimates = {}
    hd.enable("lazy")
    try:
        for recompute in (True, False, None):
            before = _estimated_s()
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(2, 4, 256, 64, generator=g, dtype=torch.bfloat16).to("hpu").requires_grad_()
                       for _ in range(3))
            gaudi.FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", recompute).float().sum().backward()
            gaudi.mark_step()
            estimates[recompute] = _estimated_s() - before
    finally:
        hd.enable("eager")
    assert estimates[False] > 1.05 * estimates[True] > 0, estimates  # differences of running sums: not exact
    assert estimates[None] == pytest.approx(estimates[True], rel=1e-9), estimates
