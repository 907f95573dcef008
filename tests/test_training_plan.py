"""The training-step plan (hpu_backend.planning.training_plan): memory by category per ZeRO stage, checkpointing,
gradient buckets, and the forward's figures checked against the eager model, parameter for parameter."""

import pytest
import torch

from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.planning.training_plan import Layout, collectives, forward_shard, memory, plan_layout
from hpu_backend.targets import fabric

SEQ = 32


@pytest.fixture(scope="module")
def spec():
    return load_model_file("models/llama.py")


@pytest.fixture(scope="module")
def shard(spec):
    return forward_shard(spec, "gaudi2", "bf16", 1)


def test_parameters_match_the_eager_model(spec, shard):
    model = spec.build_model()
    fwd = shard.at(2, SEQ)
    assert fwd["parameters"] == sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())


def test_saved_activations_cover_what_autograd_saves(spec, shard):
    """The plan's saved activations are at least what eager autograd keeps for the backward (bf16), and not
    more than twice that: a batch found from them is safe and not far from the real one."""
    model = spec.build_model().to(torch.bfloat16)
    tokens = spec.split(spec.inputs({"batch": 4, "input_len": SEQ}))[0]
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(tokens)
    actual = sum(seen.values()) + sum(o.numel() * o.element_size() for o in out[1:])
    planned = shard.at(4, SEQ)["saved_bytes"]
    assert actual <= planned <= 2 * actual, (actual, planned)


def test_zero_stages_shard_what_deepspeed_says(shard):
    fwd = shard.at(2, SEQ)
    mem = {z: memory(Layout(2, 1, z, "none", 25.0), fwd) for z in range(4)}
    psi = fwd["parameters"]
    assert mem[0]["optimizer_state_bytes"] == 8 * psi and mem[0]["master_weights_bytes"] == 4 * psi
    assert mem[1]["optimizer_state_bytes"] == 4 * psi and mem[1]["gradients_bytes"] == 2 * psi
    assert mem[2]["gradients_bytes"] == psi and mem[2]["parameters_bytes"] == 2 * psi
    assert mem[3]["parameters_bytes"] == psi
    assert all(mem[z]["activations_bytes"] == mem[0]["activations_bytes"] for z in range(4))


def _plan(shard, global_batch, micro_batch=None, **layout):
    layout = Layout(**{"cards": 2, "tp": 1, "zero": 0, "checkpointing": "none", "bucket_mb": 25.0, **layout})
    return plan_layout(shard, "llama", layout, "gaudi2", "bf16", SEQ, global_batch, micro_batch)


@pytest.mark.e2e
def test_checkpointing_trades_memory_for_recompute(shard):
    none = _plan(shard, 8, 4)
    full = _plan(shard, 8, 4, checkpointing="full")
    assert full["memory"]["activations_bytes"] < none["memory"]["activations_bytes"]
    assert full["step"]["compute_s"] == pytest.approx(none["step"]["compute_s"] * 4 / 3)


def test_bucket_size_changes_the_collectives():
    net = fabric("gaudi2")
    small = collectives(Layout(8, 1, 0, "none", 25.0, 1, 1), 7e9, net)
    large = collectives(Layout(8, 1, 0, "none", 200.0, 1, 1), 7e9, net)
    assert small[0]["kind"] == "all_reduce" and small[0]["count"] > large[0]["count"]
    assert small[0]["count"] * small[0]["seconds_each"] > large[0]["count"] * large[0]["seconds_each"]
    stage2 = collectives(Layout(8, 1, 2, "none", 25.0, 1, 4), 7e9, net)
    assert [r["kind"] for r in stage2] == ["reduce_scatter", "all_gather"]
    assert collectives(Layout(8, 8, 3, "none", 25.0, 1, 1), 7e9, net) == []  # no data parallelism


def test_plan_fits_and_reports_throughput(shard):
    doc = _plan(shard, 16, zero=1)
    assert doc["fits_hbm"] and doc["tokens_per_s"] > 0 and doc["layout"]["dp"] == 2
    assert doc["samples_per_s"] * SEQ == pytest.approx(doc["tokens_per_s"])
    assert doc["memory"]["total_bytes"] == sum(v for k, v in doc["memory"].items() if k != "total_bytes")


@pytest.mark.e2e
def test_cli_prints_the_plan_as_json_and_refuses_bad_layouts_in_one_line():
    from cli_helpers import cli, cli_json

    doc = cli_json("analyze", "models/llama.py", "--train", "--seq", SEQ, "--global-batch", 8, "--cards", 2,
                   "--zero", 2, "--bucket-mb", 1)
    assert doc["layout"]["zero"] == 2 and doc["layout"]["dp"] == 2 and doc["fits_hbm"]
    assert set(doc["memory"]) >= {"parameters_bytes", "gradients_bytes", "optimizer_state_bytes",
                                  "master_weights_bytes", "activations_bytes", "comm_buffers_bytes"}
    for args, message in ((("--zero", 5), "--zero 5"), (("--tp", 3), "--tp 3"),
                          (("--checkpointing", "some"), "--checkpointing")):
        out = cli("analyze", "models/llama.py", "--train", "--seq", SEQ, "--global-batch", 8, "--cards", 2, *args,
                  code=None)
        assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output
    out = cli("analyze", "models/llama.py", "--seq", SEQ, "--global-batch", 8, code=None)
    assert out.exit_code != 0 and "--train" in out.output
