"""Multi-card inference: the scale-up fabric model, collectives as recipe ops, tensor-parallel runs on real
processes, and capacity planning across cards."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from hpu_backend.targets import GAUDI2_FABRIC, fabric
from conftest import run_ranks

WORKERS = Path(__file__).parent / "fabric_workers.py"


# -- the fabric model ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, gbps", [("gaudi2", 100), ("gaudi3", 200)])
def test_fabric_is_the_published_port_layout(target, gbps):
    f = fabric(target)
    assert (f.ports, f.scale_up_ports, f.scale_out_ports, f.ports_per_peer) == (24, 21, 3, 3)
    assert f.scale_up_bytes_per_s() == pytest.approx(21 * gbps * 1e9 / 8)  # 262.5 / 525 GB/s (Intel's figures)
    assert f.sources


def test_collective_time_grows_with_bytes_and_shrinks_with_the_group_bandwidth():
    f = GAUDI2_FABRIC
    assert f.collective_s("all_reduce", 1 << 20, 1) == 0.0
    small, big = f.collective_s("all_reduce", 1 << 20, 8), f.collective_s("all_reduce", 1 << 30, 8)
    assert 2 * 7 * f.latency_s < small < big  # two phases, a message to each of the 7 peers
    # all-reduce = reduce-scatter + all-gather: twice the traffic and twice the latency of either
    assert f.collective_s("all_reduce", 1 << 30, 4) == pytest.approx(2 * f.collective_s("reduce_scatter", 1 << 30, 4))
    # a larger group spreads a card's share over more links: 8 cards move 1 GiB faster than 2
    assert f.collective_s("all_reduce", 1 << 30, 8) < f.collective_s("all_reduce", 1 << 30, 2)
    assert fabric("gaudi3").collective_s("all_gather", 1 << 30, 8) < f.collective_s("all_gather", 1 << 30, 8)


def test_collective_time_rejects_unknown_kinds_and_groups_beyond_the_server():
    with pytest.raises(ValueError, match="unknown collective"):
        GAUDI2_FABRIC.collective_s("broadcast", 10, 2)
    with pytest.raises(ValueError, match="1 to 8"):
        GAUDI2_FABRIC.collective_s("all_reduce", 10, 16)
    with pytest.raises(KeyError, match="known"):
        fabric("gaudi9")


# -- tensor parallel on real processes -------------------------------------------------------------------------

@pytest.mark.e2e
def test_two_rank_tensor_parallel_llama_and_gpt_match_eager_and_list_their_collectives():
    results = run_ranks(WORKERS, 2, timeout=180)
    for r in results:
        assert r["backend"] == "hccl"
        llama_ops, gpt_ops = r["llama"]["ops"], r["gpt"]["ops"]
        assert "_c10d_functional::all_reduce.default" in llama_ops
        assert "_c10d_functional::all_gather_into_tensor.default" in llama_ops  # the gathered logits
        assert "_c10d_functional::all_reduce.default" in gpt_ops
        reduces = [c for c in r["llama"]["collectives"] if c["kind"] == "all_reduce"]
        assert len(reduces) == 2 * 2  # after attention and after the MLP, in each of the 2 layers
        # the tiny LLaMA's residual stream in float32: batch 2 x 8 tokens x 64 features
        assert all(c["bytes"] == 2 * 8 * 64 * 4 and c["group_size"] == 2 and c["time_s"] > 0 for c in reduces)
        gathers = [c for c in r["llama"]["collectives"] if c["kind"] == "all_gather"]
        assert [c["bytes"] for c in gathers] == [2 * 256 * 4]  # the last position's logits, every card's half
        assert len([c for c in r["gpt"]["collectives"] if c["kind"] == "all_reduce"]) == 2


# -- collectives in the recipe (one process: groups named by the lowering context) ----------------------------

def _lowered(fn, *shapes, groups=None, target="gaudi2"):
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from hpu_backend.lowering import LoweringContext, lower, lower_bucket
    from hpu_backend.settings import Settings

    gm = make_fx(fn, tracing_mode="fake")(*(torch.randn(s) for s in shapes))
    settings = Settings.from_options({"cache": False, "execute": False, "target": target}, env={})
    ctx = LoweringContext(settings=settings, groups=groups if groups is not None else {"tp": 4})
    return lower_bucket(lower(gm, ctx).template, ctx.at({}))


def _reduce_then(independent: bool):
    import torch

    c10d = torch.ops._c10d_functional

    def fn(x, w1, w2):
        r = c10d.wait_tensor(c10d.all_reduce(x @ w1, "sum", "tp"))
        return (r + 1, x @ w2) if independent else ((r + 1) @ w2,)
    return fn


def test_a_collective_is_a_network_node_with_bytes_group_and_time():
    recipe = _lowered(_reduce_then(False), (64, 256), (256, 256), (256, 4096))
    node = next(n for n in recipe.nodes if n.op == "_c10d_functional::all_reduce.default")
    assert node.engine == "net" and node.placement == "hpu"
    (comm,) = recipe.facts["cost"]["collectives"]
    assert (comm["kind"], comm["bytes"], comm["group"], comm["group_size"]) == ("all_reduce", 64 * 256 * 4, "tp", 4)
    assert comm["time_s"] == pytest.approx(GAUDI2_FABRIC.collective_s("all_reduce", 64 * 256 * 4, 4))
    # the matmul after it reads its result: nothing overlaps it
    assert recipe.facts["cost"]["exposed_comm_s"] == pytest.approx(comm["time_s"])
    assert recipe.facts["memory"]["peak_bytes"] > 0


def test_a_collective_overlaps_independent_compute_and_marks_its_cluster_net_bound():
    ind = _lowered(_reduce_then(True), (64, 256), (256, 256), (256, 4096)).facts["cost"]
    dep = _lowered(_reduce_then(False), (64, 256), (256, 256), (256, 4096)).facts["cost"]
    assert ind["exposed_comm_s"] < ind["comm_s"]  # the second matmul runs while the all-reduce is on the wire
    assert dep["exposed_comm_s"] == pytest.approx(dep["comm_s"])
    assert [c["bound"] for c in ind["clusters"]] == ["net"]  # 64 KiB over the fabric outlasts these matmuls
    big = _lowered(_reduce_then(False), (4096, 4096), (4096, 4096), (4096, 4096)).facts["cost"]
    assert [c["bound"] for c in big["clusters"]] != ["net"]  # 137 GFLOP outlast a 64 MiB all-reduce


def test_group_sizes_are_known_or_lowering_says_which_group_is_missing():
    from hpu_backend.lowering.errors import LoweringError

    with pytest.raises(LoweringError, match="'tp': not a process group of this process"):
        _lowered(_reduce_then(False), (8, 8), (8, 8), (8, 8), groups={})


def test_a_recipe_collective_runs_only_over_a_process_group_of_this_process():
    from hpu_backend.runtime import RecipeLoadError, build_callable, check_ops

    recipe = _lowered(_reduce_then(False), (8, 8), (8, 8), (8, 8))
    check_ops(recipe)  # the structure is fine: a cache may hold it
    with pytest.raises(RecipeLoadError, match="process group 'tp' is not a group of this process"):
        build_callable(recipe)
    node = next(n for n in recipe.nodes if n.op.startswith("_c10d_functional::all_reduce"))
    for bad, message in ((["x", "sum", {"r": "x"}], "group must be a process group name"),
                         ([node.args[0], "os.system", "tp"], "reduction 'os.system'")):
        node.args = bad
        with pytest.raises(RecipeLoadError, match=message):
            check_ops(recipe)


def test_the_group_size_is_part_of_the_recipe_key():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from hpu_backend.lowering import LoweringContext, lower
    from hpu_backend.serve.keys import graph_key
    from hpu_backend.settings import Settings

    gm = make_fx(_reduce_then(False), tracing_mode="fake")(*(torch.randn(8, 8) for _ in range(3)))
    settings = Settings.from_options({"cache": False, "execute": False}, env={})
    keys = {n: graph_key(lower(gm, LoweringContext(settings=settings, groups={"tp": n})).captured, settings).parts
            for n in (2, 4)}
    assert keys[2]["graph"] != keys[4]["graph"]


def test_show_renders_the_collectives(capsys):
    from hpurecipe import recipeview

    recipe = _lowered(_reduce_then(True), (64, 256), (256, 256), (256, 4096))
    recipeview._print_fact("cost", recipe.facts["cost"])
    out = capsys.readouterr().out
    assert "cost.collectives (1)" in out and "all_reduce" in out and "group_size" in out
    assert "exposed_comm_s" in out


# -- capacity across cards -------------------------------------------------------------------------------------

def _llama():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "models" / "llama.py"
    spec = importlib.util.spec_from_file_location("fabric_test_llama", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _spec(layers: int):
    from hpu_backend.modelfiles.modelspec import spec_from

    llama = _llama()
    config = llama.Config(vocab=256, dim=64, layers=layers, heads=4, kv_heads=2, hidden=128, max_seq=512)
    return spec_from(llama.model_file(config, f"llama-{layers}"), "test-llama")


@pytest.fixture(scope="module")
def planned():
    """A 3-layer LLaMA on 2 cards, planned from its one- and two-layer shards, and lowered whole."""
    from hpu_backend.planning.capacity import card_steps

    spec = _spec(3)
    return {"layered": card_steps(spec, "gaudi2", "bf16", 2),
            "whole": card_steps(dataclasses.replace(spec, layers=None), "gaudi2", "bf16", 2)}


@pytest.mark.e2e
def test_a_deep_stack_is_estimated_from_one_and_two_layers_as_if_lowered_whole(planned):
    from hpu_backend.planning.capacity import LayeredStep

    layered, whole = planned["layered"], planned["whole"]
    assert all(isinstance(s, LayeredStep) for s in layered)
    for step, full, point in ((layered[0], whole[0], {"batch": 3, "input_len": 40}),
                              (layered[1], whole[1], {"batch": 3, "kv_len": 40})):
        est, ref = step.estimate(point), full.estimate(point)
        assert est["time_s"] == pytest.approx(ref["time_s"], rel=1e-6)
        assert est["comm_s"] == pytest.approx(ref["comm_s"], rel=1e-6) and est["collectives"] == ref["collectives"]
        assert est["hbm"]["weights_bytes"] == ref["hbm"]["weights_bytes"]
        assert est["peak_hbm_bytes"] == pytest.approx(ref["peak_hbm_bytes"], rel=0.02)
        assert step.peak_bytes(point) == pytest.approx(full.peak_bytes(point), rel=0.02)


@pytest.mark.e2e
def test_a_card_holds_its_share_of_the_weights_and_kv_cache_and_pays_the_collectives(planned):
    from hpu_backend.planning.capacity import plan_capacity

    doc = plan_capacity(*planned["layered"], "llama", "gaudi2", "bf16", 32, 8, 4, 2)
    assert doc["cards"] == 2 and doc["comm_s"] > 0 and 0 < doc["comm_share"] < 1
    vocab, dim, layers, hidden, kv_heads, head_dim, bf16 = 256, 64, 3, 128, 2, 16, 2
    replicated = vocab * dim + (2 * layers + 1) * dim  # the embedding and the norms
    per_layer = (dim * dim * 2 + dim * kv_heads * head_dim * 2 + 3 * dim * hidden) // 2  # q, o, k, v, MLP halved
    expected = (replicated + layers * per_layer + vocab * dim // 2 + head_dim // 2) * bf16  # + rotary inv_freq
    assert doc["hbm_per_card"]["weights_bytes"] == expected
    kv_len = 32 + 8 - 1  # the last decode step reads the cache of input + output - 1 tokens, 1 KV head per card
    assert doc["hbm_per_card"]["kv_cache_bytes"] == 4 * 8 + 2 * layers * 4 * kv_len * (kv_heads // 2) * head_dim * bf16
    # 2 all-reduces per layer per step, and the logits gathered once
    assert [s["collectives"] for s in doc["steps"]] == [3 * 2 + 1] * 3
    assert doc["hbm_per_card"]["comm_buffer_bytes"] == 4 * vocab * bf16  # the gathered logits: a decode step's largest


def test_capacity_across_cards_refuses_more_cards_than_a_server_and_models_without_a_shard():
    from hpu_backend.planning.capacity import CapacityError, capacity
    from hpu_backend.modelfiles.modelspec import ModelFileError

    with pytest.raises(CapacityError, match="joins 1 to 8 cards"):
        capacity(_spec(2), "gaudi2", "bf16", 8, 8, cards=16)
    with pytest.raises(CapacityError, match="PER_CARD"):
        capacity(dataclasses.replace(_spec(2), per_card=None), "gaudi2", "bf16", 8, 8, cards=2)
    with pytest.raises(ModelFileError, match=r"PER_CARD\(cards=3\) raised ValueError: .* do not split over 3 cards"):
        capacity(_spec(2), "gaudi2", "bf16", 8, 8, cards=3)  # 4 heads


@pytest.mark.e2e
def test_cli_analyze_cards_json_and_text(capsys):
    from cli_helpers import cli, cli_json
    from hpurecipe.analysis import print_capacity

    llama = Path(__file__).resolve().parent.parent / "models" / "llama.py"
    doc = cli_json("analyze", llama, "--input-len", "16", "--output-len", "4", "--cards", "2", "--batch", "2")
    assert doc["cards"] == 2 and doc["batch"] == 2 and doc["tokens_per_s"] > 0 and doc["comm_share"] > 0
    assert set(doc["hbm_per_card"]) == {"weights_bytes", "kv_cache_bytes", "activation_bytes", "comm_buffer_bytes"}
    assert {"tokens_per_s", "batch", "fits_hbm", "steps", "first_token_s"} <= set(doc)
    print_capacity(doc)
    text = capsys.readouterr().out
    assert "2 × gaudi2" in text and "collectives" in text and "HBM per card" in text
    for args, message in [(["--cards", "2"], "give --input-len and --output-len too"),
                          (["--input-len", "8", "--output-len", "8", "--cards", "0"], "--cards 0: expected a positive"),
                          (["--input-len", "8", "--output-len", "8", "--cards", "16"], "joins 1 to 8 cards")]:
        result = cli("analyze", llama, *args, code=None)
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output
