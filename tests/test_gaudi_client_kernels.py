"""The Intel kernels and names Optimum Habana and DeepSpeed call (issue "Gaudi's own stacks run unchanged"),
against the math of the code paths the clients take without them: transformers' LLaMA rotary embedding and
RMSNorm, ChatGLM's interleaved rotary formula, torch's AdamW and ctc_loss. The clients themselves run in
tests/clients/ (their own venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from hpu_backend.gaudi import hpex_kernels, hpu_ops, rotary


def _tables(seq: int, dim: int):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(seq).float(), inv)
    return angles


def test_blockwise_rotary_with_positions_is_llamas_and_its_backward_is_the_gradient():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    angles = torch.cat([_tables(16, 8)] * 2, dim=-1)  # LLaMA's layout: the angles repeated over both halves
    cos, sin = angles.cos(), angles.sin()
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k = torch.randn(2, 2, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    out = rotary.RotaryPosEmbeddingHelperV2.apply(q, cos[None, None], sin[None, None], positions)
    expected, _ = apply_rotary_pos_emb(q, k, cos[positions], sin[positions])  # Optimum's fallback, as called
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, q, grad)
    (theirs,) = torch.autograd.grad(expected, q, grad)
    torch.testing.assert_close(ours, theirs)


def test_pairwise_rotary_is_the_complex_rotation_and_the_op_matches_the_helper():
    torch.manual_seed(0)
    hpu_ops.register()
    angles = _tables(6, 8).repeat_interleave(2, dim=-1)  # interleaved layout: each angle on a channel pair
    x = torch.randn(1, 2, 6, 8)
    out = torch.ops.hpu.rotary_pos_embedding(x, angles.sin(), angles.cos(), None, 0, 1)
    turn = torch.polar(torch.ones(6, 4), _tables(6, 8))
    expected = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (4, 2))) * turn).flatten(-2)
    torch.testing.assert_close(out, expected)
    helper = rotary.apply_rotary_pos_emb(x, angles.cos(), angles.sin(), None, 0, rotary.RotaryPosEmbeddingMode.PAIRWISE)
    torch.testing.assert_close(helper, out)


@pytest.mark.parametrize("mode", [0, 1])
def test_rotary_backward_op_is_the_autograd_gradient_with_an_offset(mode):
    torch.manual_seed(0)
    hpu_ops.register()
    cos, sin = torch.randn(10, 8), torch.randn(10, 8)
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    out = rotary.rotary_pos_embedding(x, sin, cos, None, 3, mode)
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(torch.ops.hpu.rotary_pos_embedding_backward(grad, sin, cos, None, 3, mode), expected)


def test_chatglm_rotary_v3_rotates_the_first_channels_pairwise_and_passes_the_rest():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 3, 12)  # [seq, batch, heads, dim]; 8 channels rotate, 4 pass
    angles = _tables(5, 8)
    cache = torch.stack((angles.cos(), angles.sin()), dim=-1)[:, None]  # [seq, 1, 4, 2]
    out = rotary.RotaryPosEmbeddingHelperV3.apply(x, cache)
    pairwise = rotary.rotary_pos_embedding(x[..., :8].permute(1, 2, 0, 3), angles.repeat_interleave(2, -1).sin(),
                                           angles.repeat_interleave(2, -1).cos(), None, 0, 1).permute(2, 0, 1, 3)
    torch.testing.assert_close(out[..., :8], pairwise)
    assert torch.equal(out[..., 8:], x[..., 8:])


def test_fused_rms_norm_is_llamas_forward_and_backward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16, requires_grad=True)
    ours = hpex_kernels.FusedRMSNorm.apply(x, norm.weight, 1e-6)
    theirs = norm(x)
    torch.testing.assert_close(ours, theirs)
    grad = torch.randn_like(ours)
    torch.testing.assert_close(torch.autograd.grad(ours, (x, norm.weight), grad),
                               torch.autograd.grad(theirs, (x, norm.weight), grad))


@pytest.mark.parametrize("tensor_decay", [False, True])
def test_optimizer_adamw_is_adamw_with_bias_corrections_folded_into_the_step(tensor_decay):
    """As DeepSpeed's HPU FusedAdam calls it; eps is added to sqrt(v) before the folded correction (as Intel's),
    so the comparison with torch's AdamW is exact only without eps."""
    torch.manual_seed(0)
    hpu_ops.register()
    lr, wd, betas = 1e-2, 0.1, (0.9, 0.99)
    params = [torch.randn(4, 3), torch.randn(7)]
    reference = [p.clone().requires_grad_() for p in params]
    adamw = torch.optim.AdamW(reference, lr=lr, betas=betas, eps=0.0, weight_decay=wd)
    state = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    for step in range(1, 4):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(reference, grads):
            p.grad = g.clone()
        adamw.step()
        neg_step = torch.tensor([-lr * (1 - betas[1] ** step) ** 0.5 / (1 - betas[0] ** step)])
        decay = torch.tensor([1 - lr * wd]) if tensor_decay else 1 - lr * wd
        extra = (True,) if tensor_decay else ()
        torch.ops.hpu.optimizer_adamw(grads, params, *state, neg_step, *betas, 0.0, decay, *extra)
    torch.testing.assert_close(params, [p.detach() for p in reference], rtol=1e-5, atol=1e-6)


def _mixtral_experts():
    """transformers' own Mixtral experts (4 of them, top 2) and a routed batch of 6 tokens."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    torch.manual_seed(0)
    experts = MixtralExperts(MixtralConfig(hidden_size=8, intermediate_size=12, num_local_experts=4,
                                           num_experts_per_tok=2))
    for p in experts.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(6, 8, requires_grad=True)
    weights, index = torch.randn(6, 4).softmax(-1).topk(2)
    return experts, x, index, weights


@pytest.mark.parametrize("fused", [False, True])
def test_mixture_of_experts_is_the_expert_loop_of_transformers_mixtral(device_mode, fused):
    """Optimum's MoE layers call torch.ops.hpu.mixture_of_experts (w1 gate, w2 up, w3 down, one per expert):
    the output and the gradients of transformers' own loop over the routed experts, on the host and on the
    device; the ``fused_weights`` overload takes gate and up concatenated, as the 3-d parameter holds them."""
    hpu_ops.register()
    experts, x, index, weights = _mixtral_experts()
    expected = experts(x, index, weights)
    gate_up, down = experts.gate_up_proj, experts.down_proj
    for device in ("cpu", "hpu"):
        on = [t.to(device) for t in (x, index, weights, gate_up, down)]
        h, i, w, gu, d = on
        if fused:
            out = torch.ops.hpu.mixture_of_experts.fused_weights(h, i, w, list(gu.unbind()), list(d.unbind()),
                                                                 True, "silu", 0, 3)
        else:
            g, u = gu.chunk(2, dim=1)
            out = torch.ops.hpu.mixture_of_experts(hidden_states=h, expert_routing_table=i, router_weights=w,
                                                   w1=list(g.unbind()), w2=list(u.unbind()), w3=list(d.unbind()),
                                                   permuted_weights=True, activation="silu", experts_min=0,
                                                   experts_max=3)
        assert out.device.type == device
        torch.testing.assert_close(out.cpu(), expected)
        grad = torch.randn_like(expected)
        ours = torch.autograd.grad(out, (x, gate_up, down), grad.to(device))
        theirs = torch.autograd.grad(expected, (x, gate_up, down), grad, retain_graph=True)
        torch.testing.assert_close([t.cpu() for t in ours], list(theirs))


def test_mixture_of_experts_of_an_expert_range_takes_only_its_experts():
    """An expert-parallel rank holds experts_min..experts_max: tokens routed elsewhere get nothing from it, so
    the ranks' outputs sum to the whole layer's; unpermuted weights ([in, out]) give the same."""
    hpu_ops.register()
    experts, x, index, weights = _mixtral_experts()
    gate, up = experts.gate_up_proj.detach().chunk(2, dim=1)
    down = experts.down_proj.detach()
    whole = experts(x, index, weights).detach()
    parts = [torch.ops.hpu.mixture_of_experts(x, index, weights, list(gate[lo:hi + 1].mT.unbind()),
                                              list(up[lo:hi + 1].mT.unbind()), list(down[lo:hi + 1].mT.unbind()),
                                              False, "silu", lo, hi) for lo, hi in ((0, 1), (2, 3))]
    torch.testing.assert_close(parts[0] + parts[1], whole)
    with pytest.raises(ValueError, match="w1 holds 2 experts, but experts_min=0 .. experts_max=3 names 4"):
        torch.ops.hpu.mixture_of_experts(x, index, weights, list(gate[:2]), list(up[:2]), list(down[:2]), True,
                                         "silu", 0, 3)


def test_ctc_loss_takes_padded_targets_as_optimum_passes_them():
    torch.manual_seed(0)
    log_probs = torch.randn(12, 2, 6).log_softmax(-1)
    labels = torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])
    lengths, target_lengths = torch.tensor([12, 10]), torch.tensor([3, 2])
    ours = hpex_kernels.CTCLoss.apply(log_probs, labels, lengths, target_lengths, 0, "mean", False)
    theirs = F.ctc_loss(log_probs, labels[labels >= 0], lengths, target_lengths, blank=0, reduction="mean")
    torch.testing.assert_close(ours, theirs)


NAMES = """
import importlib, importlib.metadata, json, subprocess, sys
import torch
from hpu_backend.run import names
outside = [d.metadata["Name"] for d in importlib.metadata.distributions()
           if d.metadata["Name"] == "habana-torch-plugin"]
names.simulate()
import habana_frameworks.torch.core as htcore
import habana_frameworks.torch.hpu.random as hpu_random
import habana_frameworks.torch.utils.experimental as htexp
from habana_frameworks.torch.utils.internal import is_lazy
from habana_dataloader import HabanaDataLoader
ask = "import importlib.metadata as m; print(m.version('habana-torch-plugin'))"
child = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True).stdout.strip()
print(json.dumps({"outside": outside, "version": importlib.metadata.version("habana-torch-plugin"), "child": child,
                  "random": hpu_random is torch.hpu.random and len(hpu_random.default_generators) == 1
                            and hpu_random.default_generators[0] is torch.default_generator,
                  "device": htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi2,
                  "fp16": htexp._is_fp16_supported(), "lazy": is_lazy(),
                  "memory": torch.hpu.memory_stats(0)["Limit"] == torch.hpu.mem_get_info("hpu:0")[1],
                  "aliases": torch.hpu.reset_max_memory_allocated is torch.hpu.reset_peak_memory_stats,
                  "loader": issubclass(HabanaDataLoader, torch.utils.data.DataLoader),
                  "closure": htcore.step_closure._mark_step_if_lazy() is None}))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("lazy", ["0", "1"])
def test_client_names_and_the_release_distribution_under_simulate(lazy):
    env = {name: value for name, value in os.environ.items()
           if name not in ("HPU_BACKEND_DIST_PATH", "HPU_SIM_CARDS", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(PT_HPU_LAZY_MODE=lazy, HPU_SIM_RELEASE="1.21")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NAMES)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"outside": [], "version": "1.21.0", "child": "1.21.0", "random": True, "device": True,
                    "fp16": True, "lazy": lazy == "1", "memory": True, "aliases": True, "loader": True,
                    "closure": True}


AUTOLOAD = """
import json, sys
import torch.distributed as dist
from hpu_backend.run import names
names.simulate()
print(json.dumps({"hccl": "hccl" in dist.Backend.backend_list, "loaded": "habana_frameworks.torch" in sys.modules}))
"""


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_the_simulated_stack_is_loaded_with_torch_unless_autoloading_is_off(autoload):
    """Since Gaudi software 1.18 ``import torch`` loads Intel's modules (torch's device-backend autoloading), so a
    script may call ``init_process_group("hccl")`` without importing them; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
    (torch's switch) leaves them to the script's own imports."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(AUTOLOAD)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    on = autoload == "1"
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"hccl": on, "loaded": on}
