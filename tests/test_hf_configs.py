"""A Hugging Face config.json as a model: LLaMA, Mistral, Qwen2 and Mixtral built from configs written here (tiny
dimensions, nothing downloaded), their prefill and decode steps checked against the transformers model run
eagerly, and planned (weights and KV bytes per card from the lowered steps); bad configs are one line."""

from __future__ import annotations

import json

import pytest
import torch

from cli_helpers import cli, cli_json, one_line
from hpu_backend.modelfiles.hfmodels import HFConfigError, load_config
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.planning.serving import model as served

pytest.importorskip("transformers")

BASE = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "bos_token_id": 0, "eos_token_id": 1}
CONFIGS = {"llama": {}, "mistral": {"sliding_window": None}, "qwen2": {},
           "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2}}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for kind, extra in CONFIGS.items():
        folder = root / kind
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": kind, **BASE, **extra}))
        paths[kind] = folder
    return paths


def reference(step, tokens):
    """The transformers model's own logits at every position, run eagerly on the whole sequence."""
    with torch.no_grad():
        return step.lm(input_ids=tokens).logits


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_steps_match_the_transformers_model(configs, kind):
    spec = load_model_file(configs[kind])  # a directory holding config.json
    step = spec.build_model().eval()
    tokens = torch.randint(0, BASE["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    full = reference(step, tokens)
    with torch.no_grad():
        prefill = step(tokens[:, :6])
        decode = step(tokens[:, 6:], *prefill[1:])
    torch.testing.assert_close(prefill[0], full[:, 5])
    torch.testing.assert_close(decode[0], full[:, 6])
    assert len(prefill) == 1 + 2 * BASE["num_hidden_layers"] and decode[1].shape == (2, 2, 1, 8)


@pytest.mark.parametrize("kind", ["qwen2", "mixtral"])
def test_planned_weights_and_kv_bytes(configs, kind):
    spec = load_model_file(configs[kind] / "config.json")
    built = spec.build_model()
    elements = sum(t.numel() for t in [*built.parameters(), *built.buffers()])
    model = served.load(spec, "gaudi2", "bf16", 1)
    assert model.weights_bytes == 2 * elements  # bf16 parameters and buffers, every expert's weights included
    assert model.kv_bytes_per_token == 2 * 2 * BASE["num_hidden_layers"] * 2 * 8  # K and V, 2 KV heads of 8, bf16


def test_interleaved_layers_extrapolate_by_their_period(tmp_path):
    # Llama 4 alternates a dense layer and a mixture of experts: a shard extrapolated from one and two layers would
    # count a dense layer and seven expert layers; by groups of two it counts four of each, as the model has.
    folder = tmp_path / "llama4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama4_text", **BASE, "num_hidden_layers": 8, "head_dim": 8, "intermediate_size_mlp": 128,
        "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2}))
    spec = load_model_file(folder / "config.json")
    assert (spec.layers, spec.layer_period) == (8, 2)
    cards = 2
    shard = spec.per_card(cards=cards, group="tp", layers=None)["make_model"]()
    expected = 2 * sum(t.numel() for t in [*shard.parameters(), *shard.buffers()])  # one card's shard, bf16
    model = served.load(spec, "gaudi2", "bf16", cards)
    assert model.decode.period == 2 and model.decode.groups == 4
    assert model.weights_bytes == expected


def test_capacity_across_cards_takes_a_config(configs):  # (LLaMA is planned in test_serving_plan.py)
    doc = cli_json("analyze", configs["mistral"] / "config.json", "--input-len", "16", "--output-len", "4",
                   "--cards", "2", "--batch", "4")
    assert doc["cards"] == 2
    assert doc["hbm_per_card"]["comm_buffer_bytes"] > 0  # the shard's all-reduces were lowered
    # one card's shard holds half of every layer's KV heads (1 of 2, head size 8) in bf16, K and V, 2 layers, at
    # the last step's KV length, besides the batch's 4 token ids (int64)
    assert doc["hbm_per_card"]["kv_cache_bytes"] == 4 * (16 + 4 - 1) * 2 * 2 * 1 * 8 * 2 + 4 * 8


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"vocab_size": 8}', "model_type: expected a string"),
    ('{"model_type": "no-such-arch"}', "model_type 'no-such-arch' is not a causal LM architecture"),
    ('{"model_type": "llama", "num_hidden_layers": -3}', "num_hidden_layers: -3; expected an integer from 1"),
])
def test_bad_configs_are_one_line(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(HFConfigError, match=message):
        load_config(path)
    line = one_line(cli("analyze", path, "--input-len", "8", "--output-len", "2", code=1))
    assert message.split("'")[0] in line and "config.json" in line
