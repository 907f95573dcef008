"""Fusion passes on small graphs: TPC chains, reduction pro/epilogues, FusedSDPA (sdpa op; hand-written attention
costed as written)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from test_lowering_helpers import lower


def _groups(recipe):
    return [(f["kind"], [n.split(".")[0] for n in f["nodes"]]) for f in recipe.facts["fusions"]]


def _members(recipe, kind):
    return [set(f["nodes"]) for f in recipe.facts["fusions"] if f["kind"] == kind]


def test_elementwise_chain_is_one_kernel_and_views_are_looked_through():
    r = lower(lambda x: (torch.relu(x) * 2 + 1).view(-1).sigmoid(), torch.randn(8, 4))
    assert _groups(r) == [("tpc_elementwise", ["relu", "mul", "add", "view", "sigmoid"])]
    assert len({n.fusion for n in r.nodes}) == 1


def test_reduction_prologue_and_epilogue_join_the_kernel():
    r = lower(lambda x: (torch.exp(x).sum(-1) * 0.5).sqrt(), torch.randn(8, 4))
    assert _groups(r) == [("tpc_reduction", ["exp", "sum_1", "mul", "sqrt"])]


def test_no_fusion_across_engines_shapes_or_when_disabled():
    r = lower(lambda x, w: torch.relu(x @ w) + torch.ones(3), torch.randn(4, 8), torch.randn(8, 3))
    assert all(n.fusion < 0 for n in r.nodes if n.engine == "mme")
    assert lower(lambda x: torch.relu(x) * 2, torch.randn(4), fusion=False).facts["fusions"] == []
    assert all(n.fusion == -1 for n in lower(lambda x: torch.relu(x) * 2, torch.randn(4), fusion=False).nodes)


def test_fusion_never_creates_a_cycle_between_kernels():
    # relu -> mm -> add(relu, mm): fusing add into relu's kernel would need mm inside it.
    def f(x, w):
        a = torch.relu(x)
        return a + a @ w

    r = lower(f, torch.randn(4, 4), torch.randn(4, 4))
    by_name = {n.name: n.fusion for n in r.nodes}
    assert by_name["add"] == -1 or by_name["add"] != by_name["relu"]


def _attention(q, k, v, bias):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
    return scores.softmax(dim=-1) @ v


def test_handwritten_attention_is_costed_as_written_and_says_what_fused_sdpa_saves():
    """softmax(q @ kᵀ) @ v in plain ops is not a FusedSDPA kernel on Gaudi: its scores reach HBM in the
    plan and the estimate, and the estimate says what the fused call would save."""
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    bias = torch.zeros(2, 1, 1, 64)
    r = lower(_attention, q, k, v, bias)
    assert _members(r, "fused_sdpa") == []
    (found,) = r.facts["handwritten_attention"]
    ops = {n.op.split("::")[1].split(".")[0] for n in r.nodes if n.name in found["nodes"]}
    assert {"bmm", "_softmax", "div", "add"} <= ops
    scores = 2 * 4 * 64 * 64 * 4
    assert max(b[2] for b in r.facts["memory"]["buffers"]) >= scores  # the scores are an HBM buffer
    (saving,) = r.facts["cost"]["handwritten_attention"]
    assert saving["fused_saving_s"] > 0
    sdpa = lower(lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b), q, k, v, bias)
    assert sdpa.facts["cost"]["device_s"] < r.facts["cost"]["device_s"]


def test_decomposed_softmax_attention_is_recognized():
    def f(q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return (e / e.sum(-1, keepdim=True)) @ v

    r = lower(f, *(torch.randn(4, 32, 16) for _ in range(3)))
    assert len(r.facts["handwritten_attention"]) == 1 and _members(r, "fused_sdpa") == []


def test_handwritten_attention_annotated_as_a_fused_call_is_fused():
    import torch.fx.traceback as fx_traceback

    def f(q, k, v):
        with fx_traceback.annotate({"hpu_fused_sdpa": {"recompute": False}}):
            return _attention(q, k, v, 0.0)

    from hpu_backend.serve.compiled import collect_recipes

    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    with collect_recipes() as found:
        out = torch.compile(f, backend="hpu_backend", options={"cache": False})(q, k, v)
    torch.testing.assert_close(out, _attention(q, k, v, 0.0))
    ((_, r, _),) = found
    (members,) = _members(r, "fused_sdpa")
    assert "handwritten_attention" not in r.facts
    assert r.facts["memory"]["on_chip_bytes"] >= 2 * (2 * 4 * 64 * 64 * 4)  # scores and probabilities


def test_sdpa_op_is_a_fused_sdpa_group_and_unfused_it_materializes_scores():
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    r = lower(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    (group,) = _groups(r)
    assert group[0] == "fused_sdpa" and group[1][0] == "_scaled_dot_product_flash_attention_for_cpu"
    assert r.facts["memory"]["workspace_bytes"] == 0
    off = lower(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, fusion=False)
    assert off.facts["memory"]["workspace_bytes"] == 2 * (1 * 2 * 128 * 128 * 4)
    assert off.facts["cost"]["total_s"] > r.facts["cost"]["total_s"]


def test_attention_with_a_fallback_inside_is_not_fused():
    q, k, v = (torch.randn(2, 16, 8) for _ in range(3))
    r = lower(lambda q, k, v: _attention(q, k, v, 0.0), q, k, v, place_on_cpu=["div"])
    assert _members(r, "fused_sdpa") == [] and "handwritten_attention" not in r.facts


def test_sdpa_decomposed_for_dropout_in_training_is_fused_not_hand_written():
    """With dropout in training torch takes SDPA's math path on the host (bmm, softmax, dropout, bmm): the
    user called the fused kernel, so it is a FusedSDPA group, and neither pass reports hand-written attention."""
    from hpu_backend.serve.compiled import collect_recipes

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    with collect_recipes() as found:
        torch.manual_seed(0)
        out = torch.compile(f, backend="hpu_backend", options={"cache": False})(q, k, v)
        out.sum().backward()
    torch.manual_seed(0)
    torch.testing.assert_close(out, f(q, k, v))
    recipes = [r for _, r, _ in found]
    assert {r.kind for r in recipes} >= {"forward", "backward"}
    assert all("handwritten_attention" not in r.facts and r.facts["sdpa_calls"] for r in recipes)
    (forward,) = [r for r in recipes if r.kind == "forward"]
    (members,) = _members(forward, "fused_sdpa")
    ops = {n.op.split("::")[1].split(".")[0] for n in forward.nodes if n.name in members}
    assert {"bmm", "_softmax", "native_dropout"} <= ops  # decomposed, as on the host
