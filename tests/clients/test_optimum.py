"""Optimum Habana 1.21.2, unchanged, on the simulated device: GaudiTrainer and Gaudi generation against the CPU.

The reference is the same model and arguments on the CPU through transformers' own Trainer / generate (fp32).
Losses are compared at rtol 1e-4 (the logged ones are rounded to 4 decimals by the Trainer, hence the atol);
the trained weights are scored by one CPU evaluation, unrounded. Weights themselves are not compared: Adam
turns gradients of ~1e-9 into full-size steps, so summation-order differences move single weights by ~lr.
"""

from __future__ import annotations

import json

import pytest
import torch

import tiny


def _trained(path):
    saved = torch.load(path)
    model = tiny.model(saved["kind"])
    model.load_state_dict(saved["weights"])
    ids = torch.stack([row["input_ids"] for row in tiny.dataset()])
    with torch.no_grad():
        return saved["losses"], model.eval()(input_ids=ids, labels=ids).loss


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory):
    """kind -> (logged losses, final loss) of transformers' Trainer on the CPU (computed once per worker)."""
    from conftest import run_client

    done = {}

    def reference(kind):
        if kind not in done:
            tmp = tmp_path_factory.mktemp(f"cpu_{kind}")
            run_client(tmp, "train_gaudi.py", kind, "cpu", "eager", tmp / "cpu.pt", launcher=False)
            done[kind] = _trained(tmp / "cpu.pt")
        return done[kind]

    return reference


@pytest.mark.parametrize("kind, mode", [("gpt2", "lazy"), ("llama", "lazy"), ("gpt2", "eager"), ("llama", "eager"),
                                        ("llama", "compile")])
def test_gaudi_trainer_matches_the_cpu(client, tmp_path, cpu_reference, kind, mode):
    lazy = "1" if mode == "lazy" else "0"
    proc = client("train_gaudi.py", kind, "hpu", mode, tmp_path / "hpu.pt", "fused", PT_HPU_LAZY_MODE=lazy)
    losses, final = _trained(tmp_path / "hpu.pt")
    cpu_losses, cpu_final = cpu_reference(kind)
    assert len(losses) == 3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, cpu_final, rtol=1e-4, atol=0)
    assert f"{'eager' if mode == 'compile' else mode} mode" in proc.stderr  # the run report: the device's mode
    assert (torch.load(tmp_path / "hpu.pt")["graphs"] > 0) == (mode == "compile")  # torch_compile_backend was used


def test_gaudi_generate_with_fused_sdpa_matches_the_cpu(client):
    """adapt_transformers_to_gaudi() + greedy generate(use_flash_attention, static shapes): Gaudi's path (FusedSDPA,
    fused RoPE and RMSNorm on the device) gives the tokens the same code gives on the CPU."""
    tokens = json.loads(client("generate_gaudi.py", "hpu", PT_HPU_LAZY_MODE="1").stdout.strip().splitlines()[-1])
    cpu = json.loads(client("generate_gaudi.py", "cpu", PT_HPU_LAZY_MODE="1").stdout.strip().splitlines()[-1])
    assert tokens == cpu
    assert len(tokens) == 2 and all(len(row) == 6 + 8 for row in tokens)


def test_import_sees_the_simulated_release_only_under_the_launcher(client):
    """Optimum reads the release from `pip list` in a shell; the distribution exists under the launcher only."""
    seen = json.loads(client("release.py", HPU_SIM_RELEASE="1.21").stdout.strip().splitlines()[-1])
    assert seen["metadata"] == seen["pip"] == seen["optimum"] == "1.21.0"
    outside = json.loads(client("release.py", launcher=False).stdout.strip().splitlines()[-1])
    assert outside == {"metadata": None, "pip": None, "optimum": None}


def test_unknown_habana_name_fails_in_one_line_naming_it(client, tmp_path):
    with pytest.raises(AssertionError) as failed:
        client("unknown_name.py")
    assert "No module named 'habana_frameworks.torch.hpex.no_such_kernel'" in str(failed.value)
