"""models/resnet.py and models/bert.py through the backend, with every lowering pass on, against eager."""

from __future__ import annotations

import pytest
import torch

from hpu_backend.serve.compiled import collect_recipes
from conftest import load_model_file

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)


@pytest.mark.parametrize("channels_last", [False, True])
def test_resnet_trains_like_eager(channels_last):
    resnet = load_model_file("resnet")
    with collect_recipes() as found:
        ours, model = resnet.train(steps=3, channels_last=channels_last, options={"cache": False})
    ref, ref_model = resnet.train(steps=3, backend=None, channels_last=channels_last)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    kinds = {r.kind for _, r, _ in found}
    assert kinds == {"forward", "backward"}
    for _, r, _ in found:
        assert r.facts["placement"]["fallbacks"] == [] and r.facts["memory"]["peak_bytes"] > 0
        assert any(n.engine == "mme" and "convolution" in n.op for n in r.nodes)


def test_resnet_under_bf16_autocast_matches_eager_and_stays_on_the_hpu():
    resnet = load_model_file("resnet")
    model = resnet.make_model().eval()
    images, _ = resnet.make_inputs(4)
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    with collect_recipes() as found, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = compiled(images), model(images)
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)
    (recipe,) = [r for _, r, _ in found]
    convs = [n for n in recipe.nodes if "convolution" in n.op]
    assert convs and all(n.placement == "hpu" and n.out[0].dtype == "bfloat16" for n in convs)
    assert recipe.facts["placement"]["fallbacks"] == []


def test_bert_with_padding_mask_matches_eager_forward_and_backward():
    bert = load_model_file("bert")
    model = bert.make_model()
    tokens, mask, labels = bert.make_inputs(2, 24)
    compiled = torch.compile(model, backend="hpu_backend", dynamic=False, options={"cache": False})
    with collect_recipes() as found:
        loss = bert.loss(compiled(tokens, mask), tokens, mask, labels)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = bert.loss(model(tokens, mask), tokens, mask, labels)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    by_hand = {r.kind: len(r.facts.get("handwritten_attention", [])) for _, r, _ in found}
    assert by_hand == {"forward": 2, "backward": 2}  # bert's attention is written out: not FusedSDPA


def test_padding_changes_nothing_for_the_real_tokens():
    bert = load_model_file("bert")
    model = bert.make_model().eval()
    tokens, mask, _ = bert.make_inputs(1, 16)
    mask[:, 8:] = 0
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    with torch.no_grad():
        padded = compiled(tokens, mask)
        other = tokens.clone()
        other[:, 8:] = 0  # different padding tokens: masked out, so the output is the same
        torch.testing.assert_close(compiled(other, mask), padded)
