"""Hostile and foreign Hugging Face config.json files: every field is checked against the schema before
transformers sees it, and each bad one is one line naming the field, the file's value and what is allowed,
reached without planning (no hang on a huge layer count, no RecursionError on deep nesting). A config that is
not a causal LM, or that leaves out its sizes, is refused; Gemma-2 (served by vLLM-Gaudi) is planned."""

from __future__ import annotations

import json

import pytest
import torch

from cli_helpers import cli, cli_json, one_line
from hpu_backend.modelfiles.hfmodels import HFConfigError, build_config, context_length, load_config, read_config

pytest.importorskip("transformers")

SIZES = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **SIZES}


def written(tmp_path, fields, text: str | None = None):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields) if text is None else text)
    return path


def plan_error(path, code: int = 1) -> str:
    """The one line ``hpurecipe serving-plan`` prints for ``path`` (exit 1; a usage error exits 2)."""
    line = one_line(cli("serving-plan", path, "--max-model-len", "128", code=code))
    assert line.startswith("error:") and "unexpected" not in line, line
    assert code == 2 or str(path) in line, line
    return line


@pytest.mark.parametrize("field, value, expected", [
    ("num_hidden_layers", 200_000, "num_hidden_layers: 200000; expected an integer from 1 to 256"),
    ("num_hidden_layers", 2e24, "num_hidden_layers: 2e+24; expected an integer from 1 to 256"),
    ("num_hidden_layers", True, "num_hidden_layers: true; expected an integer"),
    ("num_hidden_layers", 2.0, "num_hidden_layers: 2.0; expected an integer"),
    ("hidden_size", "big", 'hidden_size: "big"; expected an integer from 1 to 65,536'),
    ("hidden_size", 1e308, "hidden_size: 1e+308; expected an integer"),
    ("hidden_size", -1, "hidden_size: -1; expected an integer from 1"),
    ("hidden_size", 30, "hidden_size: 30 is not divisible by num_attention_heads 4"),
    ("vocab_size", float("inf"), "vocab_size: Infinity; expected a finite number"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps: NaN; expected a finite number"),
    ("rms_norm_eps", "small", 'rms_norm_eps: "small"; expected a number'),
    ("tie_word_embeddings", 3, "tie_word_embeddings: 3; expected true or false"),
    ("num_key_value_heads", 3, "num_key_value_heads: 3; expected a divisor of num_attention_heads 4"),
    ("max_position_embeddings", 0, "max_position_embeddings: 0; expected an integer from 1"),
    ("num_query_groups", 10 ** 9, "num_query_groups: 1000000000; expected an integer from 0 to 16,777,216"),
    ("rope_scaling", {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}, "nested deeper than 8 levels"),
    ("bad_tokens", list(range(5000)), "bad_tokens: 5,000 items; at most 4,096"),
])
def test_a_field_outside_the_schema_is_one_line_naming_it_the_value_and_what_is_allowed(
        tmp_path, field, value, expected):
    path = written(tmp_path, {**LLAMA, field: value})
    with pytest.raises(HFConfigError, match=None) as e:
        build_config(read_config(path), str(path))
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert expected in plan_error(path)


def test_a_deeply_nested_600_kb_file_is_one_line_not_a_recursion_error(tmp_path):
    depth = 300_000
    path = written(tmp_path, None, '{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}")
    assert path.stat().st_size > 600_000
    assert "nested deeper than 8 levels" in plan_error(path)


def test_a_config_without_its_sizes_is_not_planned_from_defaults(tmp_path):
    path = written(tmp_path, {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    line = plan_error(path)
    assert "no vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size" in line, line
    assert "defaults" in line
    partial = written(tmp_path, {k: v for k, v in LLAMA.items() if k != "intermediate_size"})
    assert "no intermediate_size" in plan_error(partial)


def test_gpt2_names_its_sizes_its_own_way_and_is_read(tmp_path):
    """GPT-2's n_embd, n_layer, n_head are its hidden_size, num_hidden_layers, num_attention_heads."""
    fields = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 96, "n_embd": 32,
              "n_layer": 2, "n_head": 4, "n_positions": 64}
    config = build_config(fields, "gpt2")
    assert (config.hidden_size, config.num_hidden_layers, context_length(config)) == (32, 2, 64)
    bad = written(tmp_path, {**fields, "n_layer": 10 ** 6})
    assert "n_layer: 1000000; expected an integer from 1 to 256" in plan_error(bad)


def test_a_masked_lm_is_not_a_causal_lm(tmp_path):
    path = written(tmp_path, {"model_type": "bert", "architectures": ["BertForMaskedLM"], **SIZES})
    line = plan_error(path)
    assert 'architectures: ["BertForMaskedLM"]: not a causal LM' in line, line
    assert "not a causal LM" in one_line(cli("analyze", path, "--input-len", "8", "--output-len", "2", code=1))


def test_the_context_length_is_the_files_never_a_default(tmp_path):
    assert context_length(build_config(dict(LLAMA), "llama")) is None  # LlamaConfig's default is 2048
    path = written(tmp_path, {**LLAMA, "max_position_embeddings": 96})
    assert context_length(build_config(read_config(path), str(path))) == 96
    line = plan_error(path, code=2)  # --max-model-len 128 is past the file's 96
    assert "context length 96 (config)" in line and "2048" not in line, line


def gemma2(window: int) -> dict:
    return {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], **SIZES, "num_key_value_heads": 2,
            "head_dim": 8, "max_position_embeddings": 256, "sliding_window": window, "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}


def test_gemma2_steps_match_the_transformers_model_past_its_sliding_window(tmp_path):
    """Gemma-2 has no SDPA path in transformers (logit soft-capping): it is built with its own attention, and
    the decode step's full KV cache gives the model's logits though half its layers attend within a window of 4."""
    spec = load_config(written(tmp_path, gemma2(window=4)))
    step = spec.build_model().eval()
    tokens = torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = step.lm(input_ids=tokens).logits
        prefill = step(tokens[:, :11])
        decode = step(tokens[:, 11:], *prefill[1:])
    torch.testing.assert_close(prefill[0], full[:, 10])
    torch.testing.assert_close(decode[0], full[:, 11])
    assert prefill[1].shape == (2, 2, 11, 8) and decode[1].shape == (2, 2, 1, 8)


@pytest.mark.e2e
def test_gemma2_is_planned(tmp_path):
    path = written(tmp_path, gemma2(window=64))
    doc = cli_json("serving-plan", path, "--max-model-len", "128")
    assert doc["context_length"] == 256
    assert {b["phase"] for b in doc["buckets"]} >= {"prompt", "decode"}, doc["buckets"][:2]
