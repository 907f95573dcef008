"""The lowering on the model files: FusedSDPA per layer, the memory it saves at S=2048, bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from hpu_backend.serve.compiled import collect_recipes
from conftest import load_model_file


def _recipes(model, *inputs, backward=False, options=None, autocast=False, dynamic=False):
    compiled = torch.compile(model, backend="hpu_backend", dynamic=dynamic,
                             options={"cache": False, **(options or {})})
    with collect_recipes() as found:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.set_grad_enabled(backward):
            out = compiled(*inputs)
        if backward:
            out.float().sum().backward()
    return {r.kind: r for _, r, _ in found}, out


@pytest.mark.e2e
def test_gpt_attention_is_one_fused_sdpa_per_layer_in_every_graph():
    gpt = load_model_file("gpt")
    model = gpt.make_model(layers=3)
    tokens, _ = gpt.make_inputs(2, 16)
    recipes, _ = _recipes(model, tokens, backward=True)
    with torch.no_grad():
        inference, _ = _recipes(model, tokens)
    recipes.update(inference)
    kinds = {kind: [f["kind"] for f in r.facts["fusions"] if f["kind"].startswith("fused_sdpa")]
             for kind, r in recipes.items()}
    assert kinds == {"forward": ["fused_sdpa"] * 3, "backward": ["fused_sdpa_bwd"] * 3, "inference": ["fused_sdpa"] * 3}


@pytest.mark.e2e
def test_gpt_fused_attention_saves_at_least_one_layers_scores_at_seq_2048():
    """What is compared: the inference graph of models/gpt.py at S=2048 (batch 1), with and without
    fusion. The graph holds the sdpa op, not explicit attention; with fusion off the plan accounts
    for the S×S score and probability matrices an unfused attention materializes (a workspace of
    its step), with fusion on FusedSDPA keeps them on chip. The saving must be at least the
    B·H·S·S fp32 score buffer of one layer."""
    gpt = load_model_file("gpt")
    model = gpt.make_model(layers=2).eval()
    tokens, _ = gpt.make_inputs(1, 2048)
    fused, out_fused = _recipes(model, tokens)
    torch._dynamo.reset()
    unfused, out_unfused = _recipes(model, tokens, options={"fusion": False})
    torch.testing.assert_close(out_fused, out_unfused)  # fusion never changes the numerics
    on, off = fused["inference"].facts["memory"], unfused["inference"].facts["memory"]
    sdpa = [n for n in fused["inference"].nodes if "scaled_dot_product" in n.op]
    assert sdpa and sdpa[0].out[0].shape == [1, 4, 2048, 16]
    scores_one_layer = 1 * 4 * 2048 * 2048 * 4
    assert off["peak_bytes"] - on["peak_bytes"] >= scores_one_layer
    assert fused["inference"].facts["cost"]["total_s"] < unfused["inference"].facts["cost"]["total_s"]


@pytest.mark.e2e
def test_handwritten_attention_in_bert_is_planned_as_written_with_the_fused_saving():
    """What is compared: models/bert.py's inference graph, whose attention is written out by hand. It is
    not a FusedSDPA kernel on Gaudi, so the plan keeps its S×S scores in HBM with fusion on or off, and
    the estimate says per layer what a FusedSDPA call would save."""
    bert = load_model_file("bert")
    model = bert.make_model().eval()
    tokens, mask, _ = bert.make_inputs(2, 256)
    recipes, _ = _recipes(model, tokens, mask)
    inference = recipes["inference"]
    assert not [f for f in inference.facts["fusions"] if f["kind"] == "fused_sdpa"]
    found = inference.facts["cost"]["handwritten_attention"]
    assert len(found) == 2 and all(a["fused_saving_s"] > 0 for a in found)  # one per layer
    assert all(a["source"].split(":")[0].endswith("bert.py") for a in found)
    scores_one_layer = 2 * 4 * 256 * 256 * 4
    assert max(b[2] for b in inference.facts["memory"]["buffers"]) >= scores_one_layer


def _bf16_ops_on_hpu(recipe):
    bf16 = [n for n in recipe.nodes if n.out and n.out[0].dtype == "bfloat16" and n.engine not in ("view", "host")]
    assert bf16 and all(n.placement == "hpu" for n in bf16)
    assert any(n.engine == "mme" for n in bf16)
    assert recipe.facts["placement"]["fallbacks"] == []


@pytest.mark.e2e
def test_gpt_under_bf16_autocast_matches_eager_and_stays_on_the_hpu():
    gpt = load_model_file("gpt")
    model = gpt.make_model()
    tokens, targets = gpt.make_inputs(2, 32)
    recipes, out = _recipes(model, tokens, backward=True, autocast=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(tokens)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    for recipe in recipes.values():
        _bf16_ops_on_hpu(recipe)
    mem = recipes["forward"].facts["memory"]
    assert mem["intermediate_bytes"] > 0
