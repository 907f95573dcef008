"""The host's side of a step: the Gaudi bridge's dispatch costs and the host↔device link, one documented record.

The host runs the user's Python (measured), and for every device op, lazy graph, recipe launch and HPU-graph
replay the bridge spends time of its own before the device sees work. Those costs are not published; each
constant below says where its value comes from. A per-step host time of a serving loop was fitted on the
calibration rows the project names (``bench/host_calibration.py``) and explains almost none of their gap (the
README's table), so it is not part of this record. Every time computed from this record is an estimate, and
says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostCosts:
    """Seconds the host spends per unit of work the bridge does; bytes per second of its own copies."""

    eager_op_s: float  # one op in eager mode: dispatch, placement, a one-op recipe's lookup and launch
    lazy_op_s: float  # one op recorded into the pending lazy graph (an IR node built)
    lazy_graph_s: float  # one lazy graph cut: hashed, looked up in the recipe cache, its launch prepared
    recipe_launch_s: float  # one recipe enqueued (torch.compile graphs, lazy graphs)
    graph_replay_s: float  # one HPU-graph replay (the whole captured graph enqueued at once)
    sync_s: float  # one host read after the device drained: the read-back and the host thread's wake-up
    staging_bytes_per_s: float  # a pageable copy's memcpy into the driver's pinned staging buffer
    sources: tuple[str, ...] = field(default=())


HOST = HostCosts(
    # An op called from Python through PyTorch's dispatcher costs a few µs on a server core; the bridge's eager
    # path adds placement and a recipe-cache lookup and launch per op: assumed 30 µs in all.
    eager_op_s=30e-6,
    # Lazy mode records an IR node instead of launching: assumed the dispatcher's cost, 8 µs.
    lazy_op_s=8e-6,
    # Per graph cut: a structural hash over the graph and a cache lookup, assumed 200 µs (a small graph).
    lazy_graph_s=200e-6,
    recipe_launch_s=20e-6,  # assumed: one enqueue of a prepared recipe
    # HPU Graphs exist to cut host overhead: one replay enqueues a captured graph, assumed 25 µs.
    graph_replay_s=25e-6,
    sync_s=15e-6,  # assumed: an interrupt-driven wake-up plus a small read-back over PCIe
    staging_bytes_per_s=10e9,  # a single-threaded memcpy on a server core, about 10 GB/s
    sources=("assumed bridge dispatch costs: Intel publishes no per-op host figures",),
)
