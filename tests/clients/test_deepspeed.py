"""DeepSpeed 0.19.8, unchanged, on the simulated device (``DS_ACCELERATOR=hpu``): ``deepspeed.initialize`` with
ZeRO and DeepSpeed's ``FusedAdam`` (``torch.ops.hpu.optimizer_adamw``), against plain torch on the CPU (the same
model, data, clipping and AdamW), on one rank and on two (each rank on its card: ``set_device(LOCAL_RANK)``)."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.mark.parametrize("stage, lazy", [(1, "0"), (2, "1")])
def test_zero_with_fused_adam_on_one_rank_matches_the_cpu(client, tmp_path, stage, lazy):
    client("deepspeed_zero.py", "hpu", stage, tmp_path / "hpu.json", DS_ACCELERATOR="hpu", PT_HPU_LAZY_MODE=lazy)
    client("deepspeed_zero.py", "cpu", stage, tmp_path / "cpu.json", 1, launcher=False)
    hpu, cpu = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("hpu", "cpu"))
    assert hpu["optimizer"] == "FusedAdam" and hpu["device"] == "hpu"
    torch.testing.assert_close(torch.tensor(hpu["losses"]), torch.tensor(cpu["losses"]), rtol=1e-4, atol=0)


def test_zero_with_the_engine_compiled_matches_the_cpu(client, tmp_path):
    """``engine.compile()``: the forward compiled with the accelerator's backend, its parameters views of
    DeepSpeed's flat buffers; eager mode with torch.compile, the default of Gaudi software 1.21 and later."""
    client("deepspeed_zero.py", "hpu", 1, tmp_path / "hpu.json", "compile", DS_ACCELERATOR="hpu", PT_HPU_LAZY_MODE="0")
    client("deepspeed_zero.py", "cpu", 1, tmp_path / "cpu.json", 1, launcher=False)
    hpu, cpu = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("hpu", "cpu"))
    assert hpu["compiled"] and hpu["optimizer"] == "FusedAdam"
    torch.testing.assert_close(torch.tensor(hpu["losses"]), torch.tensor(cpu["losses"]), rtol=1e-4, atol=0)


@pytest.mark.parametrize("stage, lazy", [(1, "0"), (2, "1"), (3, "0")])
def test_zero_with_fused_adam_on_two_ranks_matches_the_cpu(client, tmp_path, stage, lazy):
    client("deepspeed_zero.py", "hpu", stage, tmp_path / "hpu.json", cards=2, DS_ACCELERATOR="hpu",
           PT_HPU_LAZY_MODE=lazy)
    client("deepspeed_zero.py", "cpu", stage, tmp_path / "cpu.json", 2, launcher=False)
    hpu, cpu = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("hpu", "cpu"))
    assert hpu["optimizer"] == "FusedAdam" and len(hpu["losses"]) == 2
    torch.testing.assert_close(torch.tensor(hpu["losses"]), torch.tensor(cpu["losses"]), rtol=1e-4, atol=0)


@pytest.mark.parametrize("lazy", ["0", "1"])
def test_inference_with_automatic_tensor_parallelism_on_two_ranks_gives_the_cpus_tokens(client, lazy):
    """``deepspeed.init_inference`` (AutoTP, tp_size 2): each rank's linear weights are its shard on its card (half
    of LLaMA's 64 query features), moved there by ``.data`` assignment; greedy tokens equal the unsharded model's
    on the CPU."""
    run = client("deepspeed_inference.py", cards=2, DS_ACCELERATOR="hpu", PT_HPU_LAZY_MODE=lazy)
    done = json.loads(run.stdout.strip().splitlines()[-1])
    assert done["world"] == 2 and done["shard"] == ["hpu:0", [32, 64]]
    assert done["hpu"] == done["cpu"] and len(done["cpu"][0]) == 6 + 8
