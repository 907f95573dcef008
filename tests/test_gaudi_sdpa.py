"""hpu_backend.gaudi.FusedSDPA: torch's attention numerics eagerly and compiled; recompute_mode changes the
recipe's memory plan, estimate and key, and survives the recipe cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.gaudi import FusedSDPA
from hpu_backend.lowering.buffers import FUSED_SDPA_ANNOTATION


def _qkv(b=2, h=3, s=16, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _grads(fn, q, k, v, *args):
    out = fn(q, k, v, *args)
    g = torch.Generator().manual_seed(1)
    q.grad = k.grad = v.grad = None
    out.backward(torch.randn(out.shape, generator=g, dtype=out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.2),
    "bool mask": dict(attn_mask=torch.rand(16, 16, generator=torch.Generator().manual_seed(3)) > 0.3),
    "float mask": dict(attn_mask=torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(4))),
    "fp32 softmax": dict(is_causal=True, softmax_mode="fp32"),  # Optimum's Qwen2 in inference
}


@pytest.mark.parametrize("recompute", [False, True, None])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_sdpa_matches_scaled_dot_product_attention_with_gradients(case, recompute, compiled):
    kw = CASES[case]

    def ours(q, k, v):
        return FusedSDPA.apply(q, k, v, kw.get("attn_mask"), 0.0, kw.get("is_causal", False), kw.get("scale"),
                               kw.get("softmax_mode", "None"), recompute)

    run = torch.compile(ours, backend="hpu_backend", options={"cache": False}) if compiled else ours
    got = _grads(run, *_qkv())
    torch_kw = {name: value for name, value in kw.items() if name != "softmax_mode"}
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **torch_kw), *_qkv())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_dropout_follows_torchs_random_stream_eagerly():
    q, k, v = _qkv()
    torch.manual_seed(5)
    got = FusedSDPA.apply(q, k, v, None, 0.3)
    torch.manual_seed(5)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, dropout_p=0.3))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_valid_sequence_lengths_attend_within_each_rows_valid_tokens(side, compiled):
    q, k, v = _qkv(b=3, s=12)
    lengths = torch.tensor([12, 7, 1])

    def ours(q, k, v, n):
        return FusedSDPA.apply(q, k, v, None, 0.0, True, None, "fast", False, n, side)

    run = torch.compile(ours, backend="hpu_backend", options={"cache": False}) if compiled else ours
    out = run(q, k, v, lengths)
    out.sum().backward()
    for b, n in enumerate(lengths.tolist()):
        window = slice(0, n) if side == "right" else slice(12 - n, 12)
        padded = slice(n, 12) if side == "right" else slice(0, 12 - n)
        qb, kb, vb = (t.detach()[b:b + 1, :, window].requires_grad_() for t in (q, k, v))
        want = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
        want.sum().backward()
        torch.testing.assert_close(out[b:b + 1, :, window], want)
        torch.testing.assert_close(q.grad[b:b + 1, :, window], qb.grad)
        torch.testing.assert_close(k.grad[b:b + 1, :, window], kb.grad)
        assert out[b, :, padded].abs().sum() == 0


def _train_recipes(recompute, b=1, h=8, s=512, d=128, dtype=torch.bfloat16, options=None):
    """{kind: (recipe, hit)} of one compiled forward and backward through FusedSDPA."""
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", recompute),
                       backend="hpu_backend", options=options or {"cache": False})
    with collect_recipes() as found:
        fn(*_qkv(b, h, s, d, dtype)).sum().backward()
    return {r.kind: (r, hit) for _, r, hit in found}


def test_recompute_changes_the_memory_plan_in_the_expected_direction():
    saved, recomputed = _train_recipes(False), _train_recipes(True)
    probs = 1 * 8 * 512 * 512 * 2  # B×H×S×L bf16
    fw_s, fw_r = saved["forward"][0].facts["memory"], recomputed["forward"][0].facts["memory"]
    bw_s, bw_r = saved["backward"][0].facts["memory"], recomputed["backward"][0].facts["memory"]
    assert (fw_s["saved_probs_bytes"], fw_r["saved_probs_bytes"]) == (probs, 0)
    assert fw_s["output_bytes"] - fw_r["output_bytes"] == probs  # kept in HBM until the backward
    assert bw_s["input_bytes"] - bw_r["input_bytes"] == probs  # and read there
    assert fw_s["peak_bytes"] > fw_r["peak_bytes"] and bw_s["peak_bytes"] > bw_r["peak_bytes"]
    for kind in ("forward", "backward"):
        fusions = [f for f in saved[kind][0].facts["fusions"] if f["kind"].startswith("fused_sdpa")]
        assert [f["recompute"] for f in fusions] == [False]
        assert [f["recompute"] for f in recomputed[kind][0].facts["fusions"]
                if f["kind"].startswith("fused_sdpa")] == [True]


def test_recompute_adds_the_forwards_attention_flops_to_the_backward_estimate():
    saved, recomputed = _train_recipes(False), _train_recipes(True)
    fw_flops = 4.0 * 1 * 8 * 512 * 512 * 128  # QKᵀ and PV
    (bw_s,), (bw_r,) = (r["backward"][0].facts["cost"]["clusters"] for r in (saved, recomputed))
    assert bw_r["flops"] - bw_s["flops"] == pytest.approx(fw_flops)
    assert bw_r["mme_s"] > bw_s["mme_s"]
    # This shape is MME-bound on the backward: recomputing costs more time than reading P back saves.
    assert bw_r["bound"] == "mme"
    assert recomputed["backward"][0].facts["cost"]["device_s"] > saved["backward"][0].facts["cost"]["device_s"]
    # The forward without recompute writes P to HBM; with it, it does not.
    (fw_s,), (fw_r,) = (r["forward"][0].facts["cost"]["clusters"] for r in (saved, recomputed))
    assert fw_s["hbm_bytes"] - fw_r["hbm_bytes"] == 1 * 8 * 512 * 512 * 2


def test_inference_saves_no_probabilities():
    q, k, v = (t.detach() for t in _qkv())
    fn = torch.compile(lambda q, k, v: FusedSDPA.apply(q, k, v, recompute_mode=False), backend="hpu_backend",
                       options={"cache": False})
    with collect_recipes() as found, torch.no_grad():
        fn(q, k, v)
    ((_, recipe, _),) = found
    assert recipe.kind == "inference" and recipe.facts["memory"]["saved_probs_bytes"] == 0


def test_the_recompute_choice_is_in_the_key_and_survives_the_cache(tmp_path):
    options = {"cache_config": f"{tmp_path},false,64"}
    small = dict(s=32, d=16, options=options)
    first = _train_recipes(False, **small)
    again = _train_recipes(False, **small)
    other = _train_recipes(True, **small)
    assert not any(hit for _, hit in first.values())
    assert all(hit for _, hit in again.values())  # read back from the store, not rebuilt
    assert not any(hit for _, hit in other.values())  # recompute is another recipe
    for kind in ("forward", "backward"):
        stored = again[kind][0]
        assert FUSED_SDPA_ANNOTATION in str(stored.facts["annotations"])
        assert stored.facts["memory"]["saved_probs_bytes"] == first[kind][0].facts["memory"]["saved_probs_bytes"] > 0
        assert other[kind][0].facts["memory"]["saved_probs_bytes"] == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(softmax_mode="fp8"), "softmax_mode='fp8' is not one of"),
    (dict(recompute_mode="yes"), "recompute_mode='yes' must be True, False or None"),
    (dict(padding_side="top"), "padding_side='top' is not one of"),
    (dict(dropout_p=1.5), "dropout_p=1.5 must be in"),
    (dict(attn_mask=torch.ones(16, 16, dtype=torch.bool), is_causal=True), "not both"),
    (dict(valid_sequence_lengths=torch.tensor([3.0, 4.0])), "integer tensor of shape"),
    (dict(valid_sequence_lengths=torch.tensor([3]), is_causal=True), "integer tensor of shape \\[2\\]"),
])
def test_what_cannot_be_honoured_is_a_one_line_error(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        FusedSDPA.apply(*_qkv(), **kwargs)
    assert "\n" not in str(e.value)


FRESH_PROCESS = """
import torch
from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.gaudi import FusedSDPA
q, k, v = (torch.randn(1, 8, 32, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
fn = torch.compile(lambda q, k, v: FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", False),
                   backend="hpu_backend", options={"cache_config": CONFIG})
with collect_recipes() as found:
    fn(q, k, v).sum().backward()
for _, r, hit in sorted(found, key=lambda f: f[1].kind):
    print(r.kind, hit, r.facts["memory"]["saved_probs_bytes"], [f.get("recompute") for f in r.facts["fusions"]])
"""


@pytest.mark.e2e
def test_a_fresh_process_reads_the_recompute_choice_back_from_disk(tmp_path):
    from conftest import run_python

    config = f"{tmp_path},false,64"
    _train_recipes(False, s=32, d=16, options={"cache_config": config})
    out = run_python(FRESH_PROCESS.replace("CONFIG", repr(config)))
    probs = 1 * 8 * 32 * 32 * 2
    assert out.split("\n")[:2] == [f"backward True {probs} [False]", f"forward True {probs} [False]"]


def test_recompute_mode_none_takes_gaudis_default_which_is_recompute():
    """The bridge starts with recompute enabled; sdp_kernel / enable_recompute_sdp change the default."""
    from hpu_backend import gaudi

    assert gaudi.recompute_sdp_enabled() is True
    (default,) = _train_recipes(None, s=64, d=32)["forward"][0].facts["fusions"]
    assert default["recompute"] is True
    torch._dynamo.reset()
    with gaudi.sdp_kernel(enable_recompute=False):
        assert gaudi.recompute_sdp_enabled() is False
        (off,) = _train_recipes(None, s=64, d=32)["forward"][0].facts["fusions"]
    assert off["recompute"] is False and gaudi.recompute_sdp_enabled() is True


def test_what_gaudis_kernel_refuses_is_refused_with_its_reason_and_the_rest_still_runs():
    """fp16 and, in recompute mode, K/V of another batch size than Q's: torch accepts both, Gaudi does not."""
    q, k, v = _qkv(dtype=torch.float16)
    with pytest.raises(ValueError, match="float16 inputs are not supported by Gaudi's FusedSDPA") as e:
        FusedSDPA.apply(q, k, v)
    assert "\n" not in str(e.value) and "bfloat16" in str(e.value)
    q, _, _ = _qkv(b=2)
    k, v, _ = _qkv(b=1)  # broadcast over Q's batch: torch computes it
    for recompute in (True, None):  # None: Gaudi's default, recompute
        with pytest.raises(ValueError, match="K/V batch size 1/1 differs from Q's 2.*recompute_mode=False"):
            FusedSDPA.apply(q, k, v, recompute_mode=recompute)
    torch.testing.assert_close(FusedSDPA.apply(q, k, v, recompute_mode=False),
                               F.scaled_dot_product_attention(q, k, v))
