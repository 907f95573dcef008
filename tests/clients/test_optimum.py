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


def _trained(path) -> dict:
    """kind -> (logged losses, loss of the trained weights on the whole dataset, what the run saved)."""
    ids = torch.stack([row["input_ids"] for row in tiny.dataset()])
    done = {}
    for kind, saved in torch.load(path).items():
        model = tiny.model(kind)
        model.load_state_dict(saved["weights"])
        with torch.no_grad():
            done[kind] = saved["losses"], model.eval()(input_ids=ids, labels=ids).loss, saved
    return done


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory):
    """cards -> kind -> (logged losses, final loss) of transformers' Trainer on the CPU, for both models: one
    process, or ``cards`` processes under torchrun (DDP over gloo, each rank its share of the batches, as the
    device's ranks); computed once per worker."""
    from conftest import run_client

    done = {}

    def reference(cards):
        if cards not in done:
            tmp = tmp_path_factory.mktemp(f"cpu_{cards}")
            run_client(tmp, "train_gaudi.py", "cpu", "eager", tmp / "cpu.pt", "gpt2,llama", launcher=False,
                       torchrun=cards if cards > 1 else None)
            done[cards] = _trained(tmp / "cpu.pt")
        return done[cards]

    return reference


def _assert_matches(trained: dict, reference: dict, cards: int) -> None:
    for kind, (losses, final, saved) in trained.items():
        cpu_losses, cpu_final, cpu_saved = reference[kind]
        assert len(losses) == 3 and saved["world"] == cpu_saved["world"] == cards
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(final, cpu_final, rtol=1e-4, atol=0)


# Each run trains every model of the case in one process (start-up is most of a run's time). Two cards:
# GaudiTrainer's DDP over hccl, against the same Trainer run on two CPU processes.
@pytest.mark.parametrize("cards, mode, kinds", [(1, "lazy", "gpt2,llama"), (1, "eager", "gpt2,llama"),
                                                (1, "compile", "gpt2,llama"), (2, "lazy", "gpt2,llama"),
                                                (2, "eager", "gpt2,llama"), (2, "compile", "gpt2,llama")])
def test_gaudi_trainer_matches_the_cpu(client, tmp_path, cpu_reference, cards, mode, kinds):
    lazy = "1" if mode == "lazy" else "0"
    proc = client("train_gaudi.py", "hpu", mode, tmp_path / "hpu.pt", kinds, "fused", cards=cards,
                  PT_HPU_LAZY_MODE=lazy)
    trained = _trained(tmp_path / "hpu.pt")
    assert sorted(trained) == sorted(kinds.split(","))
    _assert_matches(trained, cpu_reference(cards), cards)
    assert f"{'eager' if mode == 'compile' else mode} mode" in proc.stderr  # the run report: the device's mode
    for _, _, saved in trained.values():
        assert (saved["graphs"] > 0) == (mode == "compile")  # torch_compile_backend was used
        assert saved["hpu_graphs"] == []


def test_gaudi_trainer_with_hpu_graphs_for_training_matches_the_cpu(client, tmp_path, cpu_reference):
    """use_hpu_graphs_for_training (hpu.ModuleCacher, lazy mode): one capture for the fixed-shape batches, a
    replay for each later step, the CPU's losses."""
    client("train_gaudi.py", "hpu", "lazy", tmp_path / "hpu.pt", "gpt2,llama", "fused", "graphs",
           PT_HPU_LAZY_MODE="1")
    trained = _trained(tmp_path / "hpu.pt")
    _assert_matches(trained, cpu_reference(1), 1)
    for _, _, saved in trained.values():
        assert saved["hpu_graphs"] == [(1, 2)]  # the wrapped forward: 1 signature captured, 2 replays


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_gaudi_trainer_with_gradient_checkpointing_matches_the_cpu(client, tmp_path, cpu_reference, mode):
    """gradient_checkpointing=True: each layer's activations are recomputed in the backward, which changes no
    value, so the losses are those of the CPU run without it. (In lazy mode Optimum 1.21.2 swaps in a checkpoint
    of its own, whose recomputation of its LLaMA layer fails with a TypeError from the layer's code: raised by
    ``backward()`` here, see docs/guides/optimum-deepspeed.md.)"""
    client("train_gaudi.py", "hpu", mode, tmp_path / "hpu.pt", "llama", "fused", "checkpointing",
           PT_HPU_LAZY_MODE="0")
    trained = _trained(tmp_path / "hpu.pt")
    _assert_matches(trained, cpu_reference(1), 1)
    assert trained["llama"][2]["checkpointing"]


@pytest.mark.parametrize("lazy", ["1", "0"])
def test_fast_ddp_with_hpu_graphs_averages_the_gradients_of_two_ranks(client, lazy):
    """distribution_strategy="fast_ddp": gradients packed by one HPU graph (captured, then replayed), all-reduced
    asynchronously, unpacked by another; every step's gradients are the CPU's average over the ranks."""
    run = client("fast_ddp.py", cards=2, PT_HPU_LAZY_MODE=lazy)
    done = sorted((json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"rank"')),
                  key=lambda d: d["rank"])
    assert done == [{"rank": 0, "steps": 3}, {"rank": 1, "steps": 3}]


@pytest.fixture(scope="module")
def cpu_tokens(tmp_path_factory):
    """The tokens of generate_gaudi.py on CPU tensors (computed once per worker)."""
    from conftest import run_client

    run = run_client(tmp_path_factory.mktemp("cpu_generate"), "generate_gaudi.py", "cpu", PT_HPU_LAZY_MODE="1")
    return {kind: done["tokens"] for kind, done in json.loads(run.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("graphs", [False, True])
def test_gaudi_generate_with_fused_sdpa_matches_the_cpu(client, cpu_tokens, graphs):
    """adapt_transformers_to_gaudi() + greedy generate(use_flash_attention, static shapes): Gaudi's path (FusedSDPA,
    fused RoPE and RMSNorm on the device; Qwen2-MoE's experts through torch.ops.hpu.mixture_of_experts and its
    attention with an fp32 softmax), with HPU graphs (wrap_in_hpu_graph + hpu_graphs=True: the prompt's
    and the decode step's graphs captured and replayed) or without, gives the tokens the same code gives on the
    CPU."""
    run = client("generate_gaudi.py", "hpu", *(["graphs"] if graphs else []), PT_HPU_LAZY_MODE="1")
    hpu = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(hpu) == sorted(cpu_tokens) == ["llama", "qwen2_moe"]
    for kind, done in hpu.items():
        assert done["tokens"] == cpu_tokens[kind], kind
        assert len(done["tokens"]) == 2 and all(len(row) == 6 + 8 for row in done["tokens"])
        assert done["captures"] == (2 if graphs else 0)  # the prompt's graph and the decode step's, replayed after


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


@pytest.fixture(scope="module")
def cpu_architectures(tmp_path_factory):
    from conftest import run_client

    run = run_client(tmp_path_factory.mktemp("cpu_architectures"), "generate_architectures.py", "cpu")
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["lazy", "compile"])
def test_gaudi_generate_of_fifteen_architectures_matches_the_cpu(client, cpu_architectures, mode):
    """Optimum's Gaudi classes of fifteen architectures (its fused attention, RoPE, RMSNorm and MoE kernels on the
    device), greedy static-shape generation in lazy mode, or in eager mode with the model compiled: every
    architecture's tokens are those of the same code on the CPU."""
    lazy = "1" if mode == "lazy" else "0"
    run = client("generate_architectures.py", "hpu", *(["compile"] if mode == "compile" else []),
                 PT_HPU_LAZY_MODE=lazy)
    hpu = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(hpu) == 15 and sorted(hpu) == sorted(cpu_architectures)
    assert {name: tokens for name, tokens in hpu.items() if tokens != cpu_architectures[name]} == {}
    assert all(len(rows) == 2 and len(rows[0]) == 6 + 8 for rows in hpu.values())
