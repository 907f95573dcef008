"""Multi-card inference: the scale-up fabric model, collectives as recipe ops, tensor-parallel runs on real
processes, and capacity planning across cards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpu_backend.targets import GAUDI2_FABRIC, fabric

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
    assert 2 * f.latency_s < small < big
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

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_tensor_parallel_llama_and_gpt_match_eager_and_list_their_collectives():
    port, world = _free_port(), 2
    procs = [subprocess.Popen([sys.executable, str(WORKERS), str(rank), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
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
