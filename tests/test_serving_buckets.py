"""vLLM-Gaudi's bucket grid: every expected grid below is written out by hand from vLLM-Gaudi's documented rules
(docs/features/bucketing_mechanism.md, docs/features/warmup.md, docs/configuration/warm-up/managing_warm-up.md
and the strategies' docstrings), not produced by this code."""

from __future__ import annotations

import pytest

from hpu_backend.aot.serving.buckets import (BucketSettingError, Engine, exponential_range, generate,
                                              linear_range, strategy_of)

LIN = {"VLLM_BUCKETING_STRATEGY": "lin"}
SEQS_128_1024 = [128, 256, 384, 512, 640, 768, 896, 1024]


def test_linear_range_with_ramp_up():  # bucketing_mechanism.md, "Example with ramp-up"
    assert linear_range(2, 32, 64) == [2, 4, 8, 16, 32, 64]


def test_linear_range_without_ramp_up():  # bucketing_mechanism.md, "Example without ramp-up"
    assert linear_range(128, 128, 512) == [128, 256, 384, 512]


def test_exponential_range_docstring_example():  # warmup_range_with_limit's docstring: duplicates removed
    assert exponential_range(128, 128, 2048, 10) == [128, 256, 384, 512, 640, 896, 1152, 1536, 2048]


def test_exponential_prompt_lengths_of_the_documented_log():
    # bucketing_mechanism.md: "seq:[128, 128, 1024, 11]" gives query lengths 128, 256, ..., 1024
    assert exponential_range(128, 128, 1024, 11) == SEQS_128_1024
    assert exponential_range(1, 1, 1, 1) == [1]


def test_warmup_doc_grid_is_72_graphs():
    # warmup.md: prompt bs [1, 32, 4] x seq [128, 128, 1024] = 24; decode bs [1, 128, 4] x 16 lengths = 48
    env = {**LIN, "VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024",
           "VLLM_DECODE_BS_BUCKET_STEP": "128", "VLLM_DECODE_BS_BUCKET_MAX": "4", "VLLM_DECODE_BLOCK_BUCKET_MAX": "2048"}
    grid = generate(Engine(max_model_len=4096, max_num_seqs=4), cache_blocks=10_000, env=env)
    assert sorted(grid.prompt) == [(b, s) for b in (1, 2, 4) for s in SEQS_128_1024]
    assert sorted(grid.decode) == [(b, k) for b in (1, 2, 4) for k in range(128, 2049, 128)]
    assert grid.graphs == 72


def test_calibration_grid_of_the_recipe_cache_doc():
    # managing_warm-up.md (LLaMA 3.1 8B, --max-model-len 8192): prompt bs 1..256 (ramp 1-16, then 32-steps),
    # lengths 128..1024, kept where bs x length <= 8192 tokens; decode bs 128 x blocks 128..1024
    env = {**LIN, "VLLM_PROMPT_BS_BUCKET_MAX": "256", "VLLM_DECODE_BS_BUCKET_MIN": "128",
           "VLLM_DECODE_BS_BUCKET_STEP": "128", "VLLM_DECODE_BS_BUCKET_MAX": "128",
           "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024", "VLLM_DECODE_BLOCK_BUCKET_MAX": "1024"}
    grid = generate(Engine(max_model_len=8192), cache_blocks=4000, env=env)
    full = [(b, s) for b in (1, 2, 4, 8) for s in SEQS_128_1024]
    assert sorted(grid.prompt) == sorted(full + [(16, 128), (16, 256), (16, 384), (16, 512), (32, 128), (32, 256),
                                                 (64, 128)])
    assert grid.decode == tuple((128, k) for k in range(128, 1025, 128))
    assert grid.graphs == 47 and grid.omitted == 13 * 8 - 39


def test_linear_decode_blocks_capped_at_the_cache():
    env = {**LIN, "VLLM_DECODE_BS_BUCKET_MAX": "4", "VLLM_DECODE_BLOCK_BUCKET_MAX": "1024"}
    grid = generate(Engine(max_model_len=1024, max_num_seqs=4), cache_blocks=500, env=env)
    assert sorted(grid.decode) == [(b, k) for b in (1, 2, 4) for k in (128, 256, 384, 500)]


def test_linear_decode_skips_more_sequences_than_blocks():
    env = {**LIN, "VLLM_DECODE_BLOCK_BUCKET_MIN": "1", "VLLM_DECODE_BLOCK_BUCKET_STEP": "2",
           "VLLM_DECODE_BLOCK_BUCKET_MAX": "4"}
    grid = generate(Engine(max_model_len=512, max_num_seqs=4), cache_blocks=1000, env=env)
    assert sorted(grid.decode) == [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (4, 4)]


def test_prompt_budget_ignored_when_no_bucket_fits():
    env = {**LIN, "VLLM_PROMPT_BS_BUCKET_MIN": "4", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
           "VLLM_PROMPT_SEQ_BUCKET_MIN": "1024", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024"}
    grid = generate(Engine(max_model_len=1024, max_num_batched_tokens=2048), cache_blocks=1000, env=env)
    assert grid.prompt == ((4, 1024),)


def test_exponential_grid():
    # max_num_seqs 6: batch cfg [1, 2, 6, 4] -> 6^(i/3) = 1, 1.82, 3.30, 6 rounded up to 2 -> 2, 4, 6.
    # lengths [128, 128, 512, 10] -> 128 * 4^(i/9) rounded up to 128 -> 128, 256, 384, 512; budget 2048 tokens
    # drops (6, 384) and (6, 512). Blocks [1, 6, min(512 // 128 * 6, 100) = 24, 8] -> 24^(i/7) = 1, 1.6, 2.5, 3.9,
    # 6.2, 9.7, 15.2, 24 rounded up to 6 -> 6, 12, 18, 24; per batch up to the largest <= 4 * batch.
    grid = generate(Engine(max_model_len=512, max_num_seqs=6), cache_blocks=100, env={})
    assert grid.strategy == "exponential"
    assert sorted(grid.prompt) == sorted([(b, s) for b in (2, 4) for s in (128, 256, 384, 512)]
                                         + [(6, 128), (6, 256)])
    assert grid.omitted == 2
    assert list(grid.decode) == [(2, 6), (4, 6), (6, 6), (4, 12), (6, 12), (6, 18), (6, 24)]


def test_exponential_ignores_the_linear_variables():
    grid = generate(Engine(max_model_len=512, max_num_seqs=6), cache_blocks=100,
                    env={"VLLM_PROMPT_BS_BUCKET_MAX": "64"})
    assert grid.ignored == ("VLLM_PROMPT_BS_BUCKET_MAX",) and max(b for b, _ in grid.prompt) == 6


def test_strategy_selection():
    assert strategy_of({}) == "exponential"
    assert strategy_of({"VLLM_BUCKETING_STRATEGY": "lin"}) == "linear"
    assert strategy_of({"VLLM_BUCKETING_STRATEGY": "exp", "VLLM_EXPONENTIAL_BUCKETING": "false"}) == "linear"


@pytest.mark.parametrize("env, message", [
    ({"VLLM_PROMPT_BS_BUCKET_MIN": "8", "VLLM_PROMPT_BS_BUCKET_MAX": "4"},
     "VLLM_PROMPT_BS_BUCKET_MIN=8 is above VLLM_PROMPT_BS_BUCKET_MAX=4"),
    ({"VLLM_DECODE_BLOCK_BUCKET_STEP": "0"}, "VLLM_DECODE_BLOCK_BUCKET_STEP=0: expected a positive integer"),
    ({"VLLM_PROMPT_SEQ_BUCKET_MAX": "lots"}, "VLLM_PROMPT_SEQ_BUCKET_MAX='lots': expected an integer"),
    ({"VLLM_BUCKETING_STRATEGY": "zigzag"}, "VLLM_BUCKETING_STRATEGY='zigzag'"),
])
def test_contradicting_settings_are_one_line(env, message):
    with pytest.raises(BucketSettingError, match="^" + message.replace("(", r"\(").replace("[", r"\[")) as e:
        generate(Engine(max_model_len=1024), cache_blocks=1000, env={**LIN, **env})
    assert "\n" not in str(e.value)


def test_padding_maps_each_dimension_to_its_next_bucket():
    # bucketing_mechanism.md: 3 sequences of at most 412 tokens run as a (4, 512) prompt bucket
    env = {**LIN, "VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024"}
    grid = generate(Engine(max_model_len=1024, max_num_seqs=4), cache_blocks=1000, env=env)
    assert grid.prompt_bucket(3, 412) == (4, 512)
    assert grid.prompt_bucket(3, 2000) == (4, 2000)  # past the largest bucket: unpadded (a compile)
