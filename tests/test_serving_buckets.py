"""vLLM-Gaudi's bucket grid against the plugin's own generator: tests/data/vllm_gaudi_grids.json holds the grids
vllm-gaudi's ``HPUBucketingManager`` produced (its provenance is in the file: repository, commits, files, settings,
date); the range examples below are the ones the plugin's docstrings write out."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpu_backend.planning.serving import bucketfile, ranges
from hpu_backend.planning.serving.buckets import (RELEASES, BucketSettingError, Engine, Grid, generate, settings_env,
                                                  validate)

DATA = json.loads((Path(__file__).parent / "data" / "vllm_gaudi_grids.json").read_text())
ROWS = {row["name"]: row for row in DATA["grids"]}


def _engine(row: dict) -> Engine:
    s = row["settings"]
    return Engine(max_model_len=s["max_model_len"], block_size=s["block_size"], max_num_seqs=s["max_num_seqs"],
                  max_num_prefill_seqs=s["max_num_prefill_seqs"], max_num_batched_tokens=s["max_num_batched_tokens"],
                  enable_prefix_caching=s["enable_prefix_caching"], release=row["release"])


def _grid(row: dict, tmp_path: Path) -> Grid:
    env = dict(row["env"])
    if row["bucket_file"]:
        path = tmp_path / "buckets.txt"
        path.write_text(row["bucket_file"])
        env["VLLM_BUCKETING_FROM_FILE"] = str(path)
    return generate(_engine(row), row["settings"]["num_hpu_blocks"], env)


def _digest(buckets) -> str:
    return hashlib.sha256(json.dumps([list(b) for b in buckets], separators=(",", ":")).encode()).hexdigest()


def test_the_data_names_its_source():
    prov = DATA["provenance"]
    assert prov["repository"] == "https://github.com/vllm-project/vllm-gaudi"
    assert {RELEASES[r].commit for r in prov["commits"]} == set(prov["commits"].values())
    assert len(ROWS) >= 12 and {r["env"].get("VLLM_BUCKETING_STRATEGY", "exp") for r in ROWS.values()} == {
        "exp", "lin", "pad"}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_grid_is_the_plugins(name, tmp_path):
    row = ROWS[name]
    grid = _grid(row, tmp_path)
    for phase in ("prompt", "decode"):
        want, got = row[phase], getattr(grid, phase)
        if "buckets" in want:  # listed in full: the first difference is the message
            assert [list(b) for b in got] == want["buckets"], phase
        assert (len(got), _digest(got)) == (want["count"], want["sha256"]), phase


def test_the_issue_counts_as_the_plugin_gives_them_today(tmp_path):
    # LLaMA 3.1 8B, max-model-len 4096, 128 seqs, 2048 tokens, 4096 blocks, prefix caching off (16 prefill seqs)
    llama = _grid(ROWS["llama8b_exp_pc0"], tmp_path)
    assert (len(llama.prompt), len(llama.decode)) == (161, 117)
    # PR #762's setting (8192 tokens, 32768 max-model-len, 256 seqs, 4127 blocks) on main today: exp 120 prompt
    # buckets as published but over other ranges, linear 16,321 (the release PR #762 counted is tested below)
    pr762 = _grid(ROWS["pr762_exp_pc0"], tmp_path)
    assert len(pr762.prompt) == 120
    assert pr762.values["prompt_query"] == (128, 256, 384, 512, 768, 1024, 1536, 2048, 2944, 4096, 5888, 8192)
    assert ROWS["pr762_lin_pc0"]["prompt"]["count"] == 16_321
    # PR #1160's Llama-4-Maverick (21 seqs, 131072 max-model-len): its cap was reverted, and with contiguous PA
    # (prefix caching off) today's grid has the 126 decode buckets that PR counted
    maverick = _grid(ROWS["maverick_exp_pc0_45000"], tmp_path)
    assert len(maverick.decode) == 126


def test_pr_762_published_grid_at_the_release_it_counted():
    # PR #762 (the pad strategy) published, for 8192 batched tokens, 32768 max-model-len, 256 seqs and 4127 blocks,
    # the grid of vllm-gaudi main@c799e57 with its defaults (prefix caching on): its counts and all four ranges
    engine = Engine(max_model_len=32768, max_num_batched_tokens=8192, max_num_seqs=256, release="main@c799e57")
    exp = generate(engine, 4127)
    assert (exp.strategy, len(exp.prompt), len(exp.decode)) == ("exponential", 120, 81)
    assert exp.values["prompt_query"] == (128, 256, 384, 512, 640, 1792, 2816, 3968, 4992, 6144, 7168, 8192)
    assert exp.values["prompt_ctx"] == (0, 1, 3, 8, 22, 56, 90, 124, 158, 192)
    assert exp.values["decode_bs"] == (1, 2, 4, 8, 14, 24, 42, 78, 140, 256)
    assert exp.values["decode_block"] == (1, 256, 512, 768, 1024, 1280, 1536, 1792, 2304, 2816, 3584, 4352)
    lin = generate(engine, 4127, {"VLLM_EXPONENTIAL_BUCKETING": "false"})
    assert len(lin.prompt) == 14_368
    # the 4,042 linear decode buckets published are not this release's linear grid: its generator gives 342 here
    # (520 with prefix caching off); 4,042 is what the linear with padding limits of PR #925's branch gives with
    # its decode PAD_PERCENT at 0 and prefix caching on
    assert len(lin.decode) == 342
    assert len(generate(replace(engine, enable_prefix_caching=False), 4127, {"VLLM_EXPONENTIAL_BUCKETING": "0"}
                        ).decode) == 520


def test_a_release_before_the_strategy_variable():
    engine = Engine(max_model_len=4096, release="main@c799e57")
    for env in ({"VLLM_BUCKETING_STRATEGY": "lin"}, {"VLLM_BUCKETING_STRATEGY": "pad"}):
        with pytest.raises(BucketSettingError, match=r"^VLLM_BUCKETING_STRATEGY: not read by vLLM-Gaudi main@c799e57 "
                                                     r"\(2026-01-02\); set VLLM_EXPONENTIAL_BUCKETING"):
            generate(engine, 1000, env)
    # a recommended linear grid is written with the switch that release reads
    env = settings_env({"decode_bs": (1, 2, 8)}, "main@c799e57")
    assert env["VLLM_EXPONENTIAL_BUCKETING"] == "false" and "VLLM_BUCKETING_STRATEGY" not in env
    assert generate(engine, 1000, env).strategy == "linear"
    assert settings_env({"decode_bs": (1, 2, 8)})["VLLM_BUCKETING_STRATEGY"] == "lin"


def test_pr_1700_top_decode_bucket(tmp_path):
    # Qwen3-0.6B by default (prefix caching on, 256 seqs, 40960 max-model-len, 7593 blocks): before PR #1700 the
    # top decode bucket wants 81,920 blocks; main caps it at 3 x 7593
    before = _grid(ROWS["qwen3_exp_pc1_v0.27.0rc0"], tmp_path)
    after = _grid(ROWS["qwen3_exp_pc1"], tmp_path)
    assert before.decode[-1] == (256, 1, 81_920) and after.decode[-1] == (256, 1, 3 * 7593)


def test_plugin_docstring_ranges():
    assert ranges.exponential(128, 128, 2048, 10) == [128, 256, 384, 512, 640, 896, 1152, 1536, 2048]
    assert ranges.linear(2, 32, 64) == [2, 4, 8, 16, 32, 64]
    assert ranges.padding_aware(0, 8, 64, 64, 0) == [0, 1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert ranges.padding_aware(0, 8, 64, 64, 50) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert ranges.padding_aware(0, 8, 64, 16, 50) == [0, 1, 2, 4, 8, 16, 32, 48, 64]
    assert ranges.padding_aware(16, 16, 128, 32, 25) == [16, 32, 48, 64, 80, 96, 128]
    # older releases: a long context's prompt range half exponential up to MAX / limit (8192 / 13), then linear;
    # and a last value past MAX kept (4127 blocks rounded up to the batch step, 256)
    assert ranges.exponential(128, 128, 8192, 13, split=True, cap=False) == [
        128, 256, 384, 512, 640, 1792, 2816, 3968, 4992, 6144, 7168, 8192]
    assert ranges.exponential(128, 128, 8192, 3, split=True) == [8192]  # one exponential value: MAX alone
    assert ranges.exponential(1, 256, 4127, 14, cap=False)[-1] == 4352
    assert ranges.exponential(1, 256, 4127, 14)[-1] == 4127


def test_lookup_and_fallback(tmp_path):
    grid = _grid(ROWS["llama8b_exp_pc0"], tmp_path)
    assert grid.prompt_bucket(1, 100) == (1, 128, 0)
    assert grid.decode_bucket(3, 40) in grid.decode and grid.decode_bucket(3, 40) >= (3, 1, 40)
    # no bucket has 4000 query tokens: the fallback rounds up to a multiple of ceil(4000^(1/3)) x 32 = 512
    # (the plugin's calc_fallback_value docstring: 4001 -> 4096), capped at max_num_batched_tokens
    assert grid.prompt_bucket(1, 4000) == (1, 2048, 0)
    # 40 context blocks are past the largest (31): query 100 -> a multiple of 5 x 32, context 40 -> 128, capped
    # at ceil((4096 - 1) / 128) = 32; a bucket warm-up did not compile
    assert grid.prompt_bucket(1, 100, 40) == (1, 160, 32)
    assert not grid.warmed("prompt", (1, 160, 32))
    assert grid.decode_bucket(1, 10**6)[2] == grid.max_decode_blocks  # capped to the largest decode bucket


def test_bucket_file_lines():
    listed = bucketfile.parse("# c\n(1, [256, 512], [0, 4])\n(2, 1, range(8, 32, 8))\n(1, 2)\nnonsense\n")
    assert listed.prompt == ((1, 256, 0), (1, 256, 4), (1, 512, 0), (1, 512, 4))
    assert listed.decode == ((2, 1, 8), (2, 1, 16), (2, 1, 24))
    assert listed.skipped == (4, 5)


@pytest.mark.parametrize("env, message", [
    ({"VLLM_BUCKETING_STRATEGY": "fast"}, "VLLM_BUCKETING_STRATEGY='fast': expected exp, lin or pad"),
    ({"VLLM_DECODE_BS_BUCKET_MIN": "64", "VLLM_DECODE_BS_BUCKET_MAX": "8"},
     "VLLM_DECODE_BS_BUCKET_MIN=64 is above VLLM_DECODE_BS_BUCKET_MAX=8"),
    ({"VLLM_PROMPT_QUERY_BUCKET_STEP": "0"}, "VLLM_PROMPT_QUERY_BUCKET_STEP=0: expected an integer from 1"),
    ({"VLLM_DECODE_BLOCK_BUCKET_PAD_PERCENT": "60"}, "VLLM_DECODE_BLOCK_BUCKET_PAD_PERCENT=60: expected 0 to 50"),
    ({"VLLM_PROMPT_BS_BUCKET_MAX": "many"}, "VLLM_PROMPT_BS_BUCKET_MAX='many': expected an integer"),
])
def test_bad_settings_are_one_line(env, message):
    with pytest.raises(BucketSettingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(env)


def test_a_grid_of_weeks_is_refused():
    lin = {"VLLM_BUCKETING_STRATEGY": "lin"}  # every query and context value: 512 x 511 + 1 (the plugin gives 261,633)
    with pytest.raises(BucketSettingError, match=r"^prompt: 261,633 buckets, over 100,000 \(weeks of warm-up\)"):
        generate(Engine(max_model_len=8192, block_size=16, max_num_batched_tokens=8192), None, lin)
    with pytest.raises(BucketSettingError, match=r"^prompt: 1 x 4096 x 4096 = 16,777,216 combinations"):
        generate(Engine(max_model_len=65536, block_size=16, max_num_batched_tokens=65536), None, lin)


def test_exponential_names_the_variables_it_overwrites():
    grid = generate(Engine(max_model_len=2048), 1000, {"VLLM_DECODE_BS_BUCKET_STEP": "8",
                                                      "VLLM_PROMPT_BS_BUCKET_MAX": "4"})
    assert grid.ignored == ("VLLM_DECODE_BS_BUCKET_STEP",)  # BS_BUCKET_MAX sets max_num_prefill_seqs
    assert max(b for b, _, _ in grid.prompt) == 4
