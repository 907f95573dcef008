"""Capacity planning: models/llama.py against eager, its steps lowered without weights and re-planned at any
(batch, input, output); the largest batch by search; tokens/s; fp8; the CLI's analyze options."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from cli_helpers import cli, cli_json
from conftest import MODELS, load_model_file
from hpu_backend.planning.capacity import CapacityError, decode_points, plan_capacity, step_graphs
from hpu_backend.targets import device
from hpu_backend.modelfiles.modelfile import load_model_file as load_spec
from hpu_backend.modelfiles.modelspec import ModelFileError

LLAMA = str(MODELS / "llama.py")


@functools.cache
def _steps(dtype: str, target: str = "gaudi2"):
    return step_graphs(load_spec(LLAMA), target, dtype)


def _kv_bytes_per_token(config, dtype_bytes: int) -> int:
    return 2 * config.layers * config.kv_heads * config.head_dim * dtype_bytes


@pytest.mark.e2e
def test_llama_prefill_and_decode_match_eager_and_the_cache_agrees_with_prefill(seq=30):
    llama = load_model_file("llama")
    model = llama.make_model().eval()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True)
    (tokens,) = llama.make_inputs(2, seq)
    with torch.no_grad():
        past = compiled(tokens[:, :-1])
        torch.testing.assert_close(past, model(tokens[:, :-1]))
        step = compiled(tokens[:, -1:], *past[1:])  # one decode step on the cache prefill made
        torch.testing.assert_close(step, model(tokens[:, -1:], *past[1:]))
        torch.testing.assert_close(step[0], model(tokens)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.e2e
def test_steps_are_lowered_without_weights_and_hbm_follows_the_kv_cache():
    llama = load_model_file("llama")
    config = llama.CONFIG_TINY
    prefill, decode = _steps("bf16")
    weights = sum(p.numel() for p in llama.make_model().parameters()) * 2  # bf16
    kv = _kv_bytes_per_token(config, 2)
    short, long = (decode.at({"batch": 5, "kv_len": n}).facts["memory"] for n in (40, 300))
    assert long["input_bytes"] - short["input_bytes"] == 5 * 260 * kv
    tokens, rope = 5 * 8, config.head_dim // 2 * 2  # int64 token ids; the rotary frequencies (a bf16 buffer)
    assert short["input_bytes"] == weights + rope + tokens + 5 * 40 * kv
    wide = prefill.at({"batch": 7, "input_len": 50}).facts["memory"]
    assert wide["output_bytes"] >= 7 * 50 * kv  # prefill hands every layer's keys and values on


@pytest.mark.e2e
def test_fp8_halves_weights_and_cache_and_is_estimated_faster():
    (_, bf16), (_, fp8) = _steps("bf16"), _steps("fp8")
    point = {"batch": 64, "kv_len": 400}
    a, b = bf16.at(point).facts, fp8.at(point).facts
    assert b["memory"]["input_bytes"] < 0.55 * a["memory"]["input_bytes"]
    assert b["cost"]["total_s"] < a["cost"]["total_s"]
    mme = [n for n in fp8.template.nodes if n.engine == "mme"]
    assert mme and all(n.out[0].dtype == "bfloat16" for n in mme)  # outputs of matmuls stay bf16
    assert any(s.dtype == "float8_e4m3fn" for n in mme for s in fp8.template.node_map()[n.args[0]["r"]].out
               if isinstance(n.args[0], dict) and n.args[0].get("r") in fp8.template.node_map())


def test_the_dtype_policy_is_a_setting_in_every_recipe_key_and_plans_only():
    from hpu_backend.settings import Settings, SettingsError

    native = Settings.from_options({"execute": False}, env={})
    fp8 = Settings.from_options({"execute": False, "dtype_policy": "fp8"}, env={})
    assert native.key_fields()["dtype_policy"] == "native" and fp8.key_fields()["dtype_policy"] == "fp8"
    with pytest.raises(SettingsError, match="execute=false"):
        Settings.from_options({"dtype_policy": "fp8"}, env={})
    with pytest.raises(SettingsError, match="dtype_policy"):
        Settings.from_options({"dtype_policy": "int4", "execute": False}, env={})


@pytest.mark.e2e
def test_largest_batch_is_found_by_search_and_tokens_per_second_is_prefill_plus_decode_steps():
    prefill, decode = _steps("bf16")
    doc = plan_capacity(prefill, decode, "llama", "gaudi2", "bf16", 64, 9, None)
    hbm, b = device("gaudi2").hbm_bytes, doc["max_batch"]["batch"]

    def peak(batch):
        return max(prefill.peak_bytes({"batch": batch, "input_len": 64}),
                   decode.peak_bytes({"batch": batch, "kv_len": 72}))

    assert b > 1 and peak(b) <= hbm < peak(b + 1)
    assert doc["batch"] == b and doc["fits_hbm"] and not doc["decode_sampled"]
    steps = sum(decode.time_s({"batch": b, "kv_len": k}) for k in range(64, 73))
    assert doc["tokens_per_s"] == pytest.approx(b * 9 / (prefill.time_s({"batch": b, "input_len": 64}) + steps))


@pytest.mark.e2e
def test_batch_given_and_does_not_fit_even_at_batch_1():
    prefill, decode = _steps("bf16")
    doc = plan_capacity(prefill, decode, "llama", "gaudi2", "bf16", 16, 16, 3)
    assert doc["batch"] == 3 and [r["step"] for r in doc["steps"]] == ["prefill", "decode", "decode"]
    huge = plan_capacity(prefill, decode, "llama", "gaudi2", "bf16", 10 ** 9, 16, None)
    assert huge["max_batch"]["batch"] == 0 and "batch 1" in huge["max_batch"]["reason"]
    assert huge["tokens_per_s"] is None


@pytest.mark.e2e
def test_gaudi3_plans_a_larger_batch_and_more_tokens_per_second():
    docs = {t: plan_capacity(*_steps("bf16", t), "llama", t, "bf16", 128, 64, None) for t in ("gaudi2", "gaudi3")}
    assert docs["gaudi3"]["max_batch"]["batch"] > docs["gaudi2"]["max_batch"]["batch"]
    assert docs["gaudi3"]["tokens_per_s"] > docs["gaudi2"]["tokens_per_s"]


@pytest.mark.parametrize("first,count", [(5, 3), (128, 128), (2048, 2048), (7, 1000)])
def test_sampled_decode_sum_is_exact_for_steps_linear_in_the_kv_length(first, count):
    points = decode_points(first, count)
    assert sum(w for _, w in points) == pytest.approx(count)
    assert {k for k, _ in points} >= {first, first + count - 1}

    def f(k):
        return 3.0 + 0.25 * k

    assert sum(w * f(k) for k, w in points) == pytest.approx(sum(f(k) for k in range(first, first + count)))


def test_model_file_without_a_decode_step_or_with_other_axes_is_a_one_line_error(tmp_path):
    with pytest.raises(CapacityError, match="no DECODE step"):
        step_graphs(load_spec(str(MODELS / "gpt.py")), "gaudi2", "bf16")
    bad = tmp_path / "bad.py"
    bad.write_text(open(LLAMA).read() + '\nDECODE = dict(DECODE, AXES={"batch": [2], "seq": [4]}, '
                   'make_inputs=lambda batch, seq, seed=0: make_decode_inputs(batch, seq, seed))\n')
    with pytest.raises(CapacityError, match="DECODE must have AXES batch, kv_len"):
        step_graphs(load_spec(str(bad)), "gaudi2", "bf16")
    missing = tmp_path / "missing.py"
    missing.write_text(open(LLAMA).read() + '\nDECODE = {"AXES": {"batch": [2], "kv_len": [4]}}\n')
    with pytest.raises(ModelFileError, match="DECODE must define its own make_inputs"):
        load_spec(str(missing))


@pytest.mark.e2e
def test_cli_analyze_capacity_json_and_errors(capsys):
    from hpurecipe.analysis import print_capacity

    doc = cli_json("analyze", LLAMA, "--input-len", "32", "--output-len", "40", "--dtype", "fp8", "--batch", "4",
                   "--target", "gaudi3")
    assert doc["estimate"] and doc["dtype"] == "fp8" and doc["target"] == "gaudi3" and doc["batch"] == 4
    assert doc["decode_sampled"] and doc["max_batch"]["batch"] > 4
    assert math.isclose(doc["tokens_per_s"], 4 * 40 / doc["total_s"])
    print_capacity(doc)
    out = capsys.readouterr().out
    assert "Largest batch that fits gaudi3 HBM" in out and f"{doc['tokens_per_s']:,.0f} tokens/s" in out
    for args, message in [(["--input-len", "32"], "needs both --input-len and --output-len"),
                          (["--dtype", "fp8"], "give --input-len and --output-len too"),
                          (["--input-len", "8", "--output-len", "8", "--dtype", "int4"], "expected bf16 or fp8"),
                          (["--input-len", "0", "--output-len", "8"], "--input-len 0: expected a positive")]:
        result = cli("analyze", LLAMA, *args, code=2)
        assert message in result.output and "Traceback" not in result.output
    gpt = cli("analyze", str(MODELS / "gpt.py"), "--input-len", "8", "--output-len", "8", code=1).output
    assert "no DECODE step" in gpt and "Traceback" not in gpt
