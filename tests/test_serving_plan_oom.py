"""Out of memory before it happens: vllm-gaudi PR #1700's case, a default ``vllm serve Qwen/Qwen3-0.6B``, planned
from its config.json alone (built here from the model's published sizes) on a Gaudi 3 card. Before the PR the top
decode bucket wants 81,920 KV blocks where 7,593 exist and warm-up dies at its first decode step; the PR's clamp
(vllm-gaudi main) leaves 3 x 7,593 and every step fits."""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli
from hpu_backend.planning.serving import buckets as bk

QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
             "bos_token_id": 151643, "eos_token_id": 151645}
PUBLISHED_BLOCKS = 7593  # the PR's log: "Usable KV blocks: 7593"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The plan of a default serve (prefix caching on, 256 sequences, max-model-len 40960) under both releases,
    the model lowered once."""
    from hpu_backend.modelfiles.modelfile import load_model_file
    from hpu_backend.planning.serving import model as sm
    from hpu_backend.planning.serving.plan import plan

    path = tmp_path_factory.mktemp("qwen3") / "config.json"
    path.write_text(json.dumps(QWEN3_06B))
    served = sm.load(load_model_file(str(path)), "gaudi3", "bf16", 1)
    out = {}
    for release in ("v0.27.0rc0", "main"):
        for blocks in (None, PUBLISHED_BLOCKS):
            engine = bk.Engine(max_model_len=40960, release=release, num_gpu_blocks_override=blocks)
            out[release, blocks] = plan(served, engine, {})
    return out


def test_the_kv_cache_is_sized_as_published(plans):
    blocks = plans["main", None]["memory"]["kv_blocks"]
    assert abs(blocks / PUBLISHED_BLOCKS - 1) < 0.02, blocks  # from the config alone, within 2% of the log


@pytest.mark.parametrize("blocks", [None, PUBLISHED_BLOCKS])
def test_oom_at_the_first_decode_warmup_step_before_the_fix(plans, blocks):
    doc = plans["v0.27.0rc0", blocks]
    oom = doc["warmup"]["steps"]["first_oom"]
    prompts = len(doc["grid"]["prompt"])
    assert oom["index"] == prompts  # decode buckets warm after every prompt bucket, largest first
    assert oom["step"] == "decode bucket (256, 1, 81920)" and doc["grid"]["decode"][-1] == [256, 1, 81920]
    have = doc["memory"]["kv_blocks"]
    assert f"wants 81,920 KV blocks where {have:,} exist" in oom["change"]
    assert "VLLM_CONTIGUOUS_PA=true" in oom["change"]
    assert oom["need_bytes"] + oom["graphs_bytes"] > oom["room_bytes"]
    # the gather alone: one layer's K and V (8 heads x 128 x bf16 x 2) for 81,920 blocks of 128 tokens, 40 GiB
    assert oom["need_bytes"] > 81920 * 128 * 8 * 128 * 2 * 2


def test_the_fix_fits(plans):
    doc = plans["main", PUBLISHED_BLOCKS]
    assert doc["grid"]["decode"][-1] == [256, 1, 3 * PUBLISHED_BLOCKS]
    assert doc["warmup"]["steps"]["first_oom"] is None and doc["warmup"]["steps"]["fits"]
    assert doc["vllm_gaudi"]["release"].startswith("main@091bbad")


def test_an_override_past_the_card_is_the_first_step(tmp_path):
    # a tiny LLaMA: 2 layers x K,V x 2 heads x 8 x bf16 = 128 bytes a token, 16 KiB a block of 128
    tiny = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "bos_token_id": 0, "eos_token_id": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny))
    result = cli("serving-plan", path, "--max-model-len", "256", "--num-gpu-blocks-override", "10000000")
    most = (96 * 2**30 - 0) // (16 * 2**10)  # at most this many blocks, fewer with the weights
    assert "out of memory at KV cache allocation: needs 152.6 GiB" in result.output, result.output
    assert "--num-gpu-blocks-override 10,000,000 is past the" in result.output and most > 6_000_000
