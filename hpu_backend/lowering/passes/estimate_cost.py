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
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..buffers import alias_roots, internal_values, recompute_choice, saved_probs_bytes, sdpa_workspace_bytes
from ..context import LoweringContext
from ...targets import HOST_BYTES_PER_S, HOST_FLOPS, DeviceSpec, device
from ..flops import mme_flops, tpc_flops
from ..optable import shared_table
from ..values import nbytes, node_refs, spec_map, with_fields


def estimate_cost(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    dev = device(recipe.target)
    cost = _cost(recipe, dev)
    if recipe.facts.get("handwritten_attention"):
        cost["handwritten_attention"] = [_fused_saving(recipe, dev, cost, a)
                                         for a in recipe.facts["handwritten_attention"]]
    return dataclasses.replace(recipe, facts=dict(recipe.facts, cost=cost))


def _cost(recipe: Recipe, dev: DeviceSpec) -> dict:
    work = _Work(recipe, recipe.facts["plan_at"])
    clusters: dict[int, dict[str, float]] = {}
    cpu_s = 0.0
    for node in recipe.nodes:
        if node.engine in ("view", "host"):
            continue
        flops, moved, dtype = work.flops(node), work.hbm_bytes(node), work.dtype(node)
        if node.placement == "cpu":
            cpu_s += flops / HOST_FLOPS + moved / HOST_BYTES_PER_S
            continue
        c = clusters.setdefault(node.cluster, {"mme_s": 0.0, "tpc_s": 0.0, "hbm_bytes": 0, "flops": 0.0})
        c["mme_s" if node.engine == "mme" else "tpc_s"] += flops / _peak(dev, node.engine, dtype)
        c["hbm_bytes"] += moved
        c["flops"] += flops
    return _summary(recipe, dev, clusters, cpu_s)


def _fused_saving(recipe: Recipe, dev: DeviceSpec, cost: dict, attention: dict) -> dict:
    """What one FusedSDPA call would save over the hand-written attention: the same estimate with the
    attention's nodes as one fused kernel (its scores and probabilities kept on chip)."""
    members, fid = set(attention["nodes"]), max((n.fusion for n in recipe.nodes), default=-1) + 1
    fused = dataclasses.replace(recipe, nodes=[with_fields(n, fusion=fid) if n.name in members else n
                                               for n in recipe.nodes])
    saving = cost["device_s"] - _cost(fused, dev)["device_s"]
    return {"kind": attention["kind"], "source": attention["source"], "nodes": len(members),
            "fused_saving_s": max(saving, 0.0)}


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
                     "published peaks times fitted efficiency); device = the clusters' times; total = device + "
                     "cpu + transfer"}


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
            return mme_flops(node, self.inputs(node), self.env, recompute_choice(self.recipe, node))
        record = self.table.lookup(node.op)
        return tpc_flops(record.kind if record else "elementwise", self.inputs(node), node, self.env)

    def hbm_bytes(self, node) -> int:
        read = sum(nbytes(s, self.env) for r in node_refs(node) if self.roots.get((r, 0)) not in self.on_chip
                   for s in self.specs.get(r, [])[:1])
        written = sum(nbytes(s, self.env) for k, s in enumerate(node.out)
                      if self.roots.get((node.name, k)) not in self.on_chip)
        scratch = 2 * sdpa_workspace_bytes(node, self.specs, self.env) if node.fusion < 0 else 0
        saved = saved_probs_bytes(self.recipe, node, self.specs, self.env)  # written by the forward, read back
        return read + written + scratch + saved
