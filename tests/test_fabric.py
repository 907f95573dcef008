"""Multi-card inference: the scale-up fabric model, collectives as recipe ops, tensor-parallel runs on real
processes, and capacity planning across cards."""

from __future__ import annotations

import pytest

from hpu_backend.targets import GAUDI2_FABRIC, fabric


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
