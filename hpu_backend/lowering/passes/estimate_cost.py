"""Estimate cost: a roofline per cluster at the bucket's upper end, plus CPU-fallback and host-link time.

A cluster's MME work, TPC work and HBM traffic overlap on the device (the engines run as a
pipeline), so its time is the largest of the three plus one launch. Values that stay inside a
fused kernel add no HBM traffic; an unfused sdpa op writes and reads its score matrices, and so does
attention written out by hand (``fuse_attention``), whose estimate says what a FusedSDPA call would save
(``cost["handwritten_attention"]``). FusedSDPA
without recompute writes its probabilities in the forward and reads them in the backward; with
recompute the backward does the forward's attention FLOPs again (``flops.mme_flops``). CPU
fallbacks run at assumed host rates and each host↔device copy pays the link. Device rates are the
published peaks times the fitted per-engine efficiency (``devices.EFFICIENCY``); figures come from
``hpu_backend/targets.py``; every number this pass writes is an estimate, and is labelled so.

Collectives run on the network engines at the times of the target's scale-up fabric model
(``targets.Fabric.collective_s``), beside the compute: a cluster with collectives is scheduled as two
in-order streams (compute, network) that follow the dependency graph, so a collective overlaps the compute
that neither feeds it nor reads it, and waits for (or holds up) the rest. The compute nodes share the
cluster's roofline time in proportion to their own rooflines. A cluster whose collectives take longer than
its compute is communication-bound (``bound: "net"``).
"""

from __future__ import annotations

import dataclasses
import heapq

from ...formats.recipe import Recipe
from ..buffers import (SDPA_BACKWARD, SDPA_FORWARD, alias_roots, internal_values, recompute_choice,
                       saved_probs_bytes, sdpa_operands, sdpa_workspace_bytes)
from ..context import LoweringContext
from ...targets import HOST_BYTES_PER_S, HOST_FLOPS, DeviceSpec, Fabric, device, fabric
from ..flops import mme_flops, tpc_flops
from ..optable import packet_name, shared_table
from ..values import nbytes, node_refs, spec_map, with_fields


SDPA_OPS = SDPA_FORWARD | SDPA_BACKWARD


def estimate_cost(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    dev = device(recipe.target)
    cost = _cost(recipe, dev)
    if recipe.facts.get("handwritten_attention"):
        cost["handwritten_attention"] = [_fused_saving(recipe, dev, cost, a)
                                         for a in recipe.facts["handwritten_attention"]]
    return dataclasses.replace(recipe, facts=dict(recipe.facts, cost=cost))


def _cost(recipe: Recipe, dev: DeviceSpec) -> dict:
    net = fabric(recipe.target)
    work = _Work(recipe, recipe.facts["plan_at"])
    clusters: dict[int, dict[str, float]] = {}
    node_s: dict[str, float] = {}  # each compute node's own roofline; each collective's time
    comms: list[dict] = []
    cpu_s = 0.0
    for node in recipe.nodes:
        if node.engine in ("view", "host"):
            continue
        if node.engine == "net" and node.placement != "cpu":
            comms.append(work.collective(node, net))
            node_s[node.name] = comms[-1]["time_s"]
            continue
        flops, moved, dtype = work.flops(node), work.hbm_bytes(node), work.dtype(node)
        if node.placement == "cpu":
            cpu_s += flops / HOST_FLOPS + moved / HOST_BYTES_PER_S
            continue
        c = clusters.setdefault(node.cluster, _no_work())
        compute_s = flops / _peak(dev, node.engine, dtype)
        c["mme_s" if node.engine == "mme" else "tpc_s"] += compute_s
        c["hbm_bytes"] += moved
        c["flops"] += flops
        node_s[node.name] = max(compute_s, moved / (dev.hbm_bytes_per_s * dev.efficiency.hbm))
    for comm in comms:  # a cluster may hold nothing but collectives
        clusters.setdefault(comm["cluster"], _no_work())
    cost = _summary(recipe, dev, clusters, cpu_s)
    return _with_collectives(recipe, cost, comms, node_s, net) if comms else cost


def _fused_saving(recipe: Recipe, dev: DeviceSpec, cost: dict, attention: dict) -> dict:
    """What one FusedSDPA call would save over the hand-written attention: the same estimate with the
    attention's nodes as one fused kernel (its scores and probabilities kept on chip)."""
    members, fid = set(attention["nodes"]), max((n.fusion for n in recipe.nodes), default=-1) + 1
    fused = dataclasses.replace(recipe, nodes=[with_fields(n, fusion=fid) if n.name in members else n
                                               for n in recipe.nodes])
    saving = cost["device_s"] - _cost(fused, dev)["device_s"]
    return {"kind": attention["kind"], "source": attention["source"], "nodes": len(members),
            "fused_saving_s": max(saving, 0.0)}


def _no_work() -> dict[str, float]:
    return {"mme_s": 0.0, "tpc_s": 0.0, "hbm_bytes": 0, "flops": 0.0}


def _with_collectives(recipe: Recipe, cost: dict, comms: list[dict], node_s: dict[str, float], net: Fabric) -> dict:
    """The clusters' times with their collectives scheduled beside their compute; the collectives listed."""
    rows, exposed_total = [], 0.0
    for row in cost["clusters"]:
        mine = [c for c in comms if c["cluster"] == row["id"]]
        compute_s = row["time_s"] - row["launch_s"]
        span = _two_streams(recipe, row["id"], compute_s, node_s) if mine else compute_s
        net_s, latency_s = sum(c["time_s"] for c in mine), sum(c["latency_s"] for c in mine)
        exposed = max(span - compute_s, 0.0)
        exposed -= net.overlap * min(max(exposed - latency_s, 0.0), compute_s)  # sliced and pipelined
        exposed_total += exposed
        bound = "net" if net_s > compute_s else row["bound"]
        rows.append({**row, "net_s": net_s, "net_latency_s": latency_s, "exposed_net_s": exposed, "bound": bound,
                     "time_s": compute_s + exposed + row["launch_s"]})
    device_s = sum(r["time_s"] for r in rows)
    return {**cost, "clusters": rows, "device_s": device_s, "total_s": device_s + cost["cpu_s"] + cost["transfer_s"],
            "collectives": comms, "comm_s": sum(c["time_s"] for c in comms), "exposed_comm_s": exposed_total,
            "comm_latency_s": sum(c["latency_s"] for c in comms)}


def _two_streams(recipe: Recipe, cluster: int, compute_s: float, node_s: dict[str, float]) -> float:
    """The cluster's makespan with compute and collectives on two streams that follow the data: each stream
    runs, of the nodes whose inputs are ready, the one ready first (schedule order breaks ties)."""
    nodes = [n for n in recipe.nodes if n.cluster == cluster]
    index = {n.name: i for i, n in enumerate(nodes)}
    deps = {n.name: {r for r in node_refs(n) if r in index} for n in nodes}
    users: dict[str, list[str]] = {}
    for name, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(name)
    stream = {n.name: ("net" if n.engine == "net" else "compute") for n in nodes
              if n.name in node_s and n.engine not in ("view", "host")}
    own = sum(node_s[name] for name, s in stream.items() if s == "compute")
    scale = compute_s / own if own > 0 else 0.0  # compute nodes share the cluster's roofline time
    waiting = {name: len(ds) for name, ds in deps.items()}
    ready = dict.fromkeys(index, 0.0)
    queues: dict[str, list] = {"compute": [], "net": []}
    free = {"compute": 0.0, "net": 0.0}

    def finish(name: str, t: float) -> None:
        """``name`` is done at ``t``: queue its readers whose inputs are all done (views finish at once)."""
        todo = [(name, t)]
        while todo:
            done, at = todo.pop()
            for u in users.get(done, ()):
                ready[u], waiting[u] = max(ready[u], at), waiting[u] - 1
                if waiting[u] == 0 and u in stream:
                    heapq.heappush(queues[stream[u]], (ready[u], index[u], u))
                elif waiting[u] == 0:
                    todo.append((u, ready[u]))

    for name in [n for n, k in waiting.items() if k == 0]:
        if name in stream:
            heapq.heappush(queues[stream[name]], (0.0, index[name], name))
        else:
            finish(name, 0.0)
    while queues["compute"] or queues["net"]:
        begin, which = min((max(free[k], q[0][0]), k) for k, q in queues.items() if q)
        _, _, name = heapq.heappop(queues[which])
        free[which] = begin + node_s[name] * (1.0 if which == "net" else scale)
        finish(name, free[which])
    return max(free.values())


def _peak(dev: DeviceSpec, engine: str, dtype: str) -> float:
    """The rate the estimate assumes: the published peak times the engine's efficiency."""
    eff = dev.efficiency
    return dev.mme_peak(dtype) * eff.mme if engine == "mme" else dev.tpc_peak(dtype) * eff.tpc


def _summary(recipe: Recipe, dev: DeviceSpec, clusters: dict, cpu_s: float) -> dict:
    rows, eff = [], dev.efficiency
    for cid in sorted(clusters):
        c = clusters[cid]
        terms = {"mme": c["mme_s"], "tpc": c["tpc_s"], "hbm": c["hbm_bytes"] / (dev.hbm_bytes_per_s * eff.hbm)}
        bound = max(terms, key=terms.get)
        rows.append({"id": cid, "mme_s": terms["mme"], "tpc_s": terms["tpc"], "hbm_s": terms["hbm"],
                     "hbm_bytes": c["hbm_bytes"], "flops": c["flops"], "bound": bound,
                     "launch_s": dev.launch_s, "time_s": terms[bound] + dev.launch_s})
    moves = recipe.facts.get("host_transfers", {"count": 0, "bytes": 0})
    transfer_s = moves["bytes"] / (dev.host_bytes_per_s * eff.host) + moves["count"] * dev.host_latency_s
    device_s = sum(r["time_s"] for r in rows)
    return {"estimate": True, "target": dev.name, "plan_at": dict(recipe.facts["plan_at"]),
            "device_s": device_s, "cpu_s": cpu_s, "transfer_s": transfer_s,
            "total_s": device_s + cpu_s + transfer_s, "clusters": rows,
            "efficiency": {"mme": eff.mme, "tpc": eff.tpc, "hbm": eff.hbm, "host": eff.host},
            "sources": [*dev.sources, *eff.sources],
            "note": "estimate: per cluster, time = launch + the largest of MME, TPC and HBM time (roofline from "
                     "published peaks times fitted efficiency) + collective time not overlapped with compute; "
                     "device = the clusters' times; total = device + cpu + transfer"}


class _Work:
    """FLOPs, HBM bytes and dtype of each node at the plan's shapes."""

    def __init__(self, recipe: Recipe, env):
        self.recipe = recipe
        self.env = env
        self.specs = spec_map(recipe)
        self.roots = alias_roots(recipe)
        self.on_chip = internal_values(recipe, self.roots)
        self.table = shared_table()

    def inputs(self, node):
        return [s for r in node_refs(node) for s in self.specs.get(r, []) if s.kind == "tensor"]

    def dtype(self, node) -> str:
        found = [s.dtype for s in [*self.inputs(node), *node.out] if s.kind == "tensor"]
        return found[0] if found else "float32"

    def flops(self, node) -> float:
        if node.engine == "mme":
            ins = sdpa_operands(node, self.specs) if packet_name(node.op) in SDPA_OPS else self.inputs(node)
            return mme_flops(node, ins, self.env, recompute_choice(self.recipe, node))
        record = self.table.lookup(node.op)
        return tpc_flops(record.kind if record else "elementwise", self.inputs(node), node, self.env)

    def collective(self, node, net: Fabric) -> dict:
        """A collective's bytes, group and estimated time on the target's scale-up fabric."""
        group = self.recipe.facts.get("collectives", {}).get(node.name, {})
        kind, size = group.get("kind", "all_reduce"), int(group.get("group_size", 1))
        spec = node.out[0] if kind == "all_gather" else (self.inputs(node) or node.out)[0]
        moved = nbytes(spec, self.env)
        time_s = net.collective_s(kind, moved, min(size, net.cards_per_server))
        latency = net.collective_s(kind, 0, min(size, net.cards_per_server))
        return {"node": node.name, "kind": kind, "bytes": moved, "group": group.get("group", ""),
                "group_size": size, "cluster": node.cluster, "time_s": time_s, "latency_s": latency}

    def hbm_bytes(self, node) -> int:
        read = sum(nbytes(s, self.env) for r in node_refs(node) if self.roots.get((r, 0)) not in self.on_chip
                   for s in self.specs.get(r, [])[:1])
        written = sum(nbytes(s, self.env) for k, s in enumerate(node.out)
                      if self.roots.get((node.name, k)) not in self.on_chip)
        scratch = 2 * sdpa_workspace_bytes(node, self.specs, self.env) if node.fusion < 0 else 0
        saved = saved_probs_bytes(self.recipe, node, self.specs, self.env)  # written by the forward, read back
        return read + written + scratch + saved
