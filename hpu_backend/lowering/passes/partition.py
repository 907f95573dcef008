"""Partition: group HPU nodes into clusters (one device graph each); CPU fallbacks split clusters.

Uses torch.fx's ``CapabilityBasedPartitioner`` over the aten graph: it merges supported nodes
into the largest groups that keep the cluster graph acyclic, which is what the bridge needs to
hand each cluster to the graph compiler as one recipe. Host scalar ops and tuple elements count
as supported, so shape arithmetic never splits a cluster. Cluster ids follow schedule order.
"""

from __future__ import annotations

import dataclasses

from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ...recipe import Recipe
from ..context import LoweringContext
from ..errors import LoweringError


class _OnHpu(OperatorSupportBase):
    def __init__(self, hpu: set[str]):
        self.hpu = hpu

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and node.name in self.hpu


def partition(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    if ctx.gm is None:
        raise LoweringError("partition needs the aten graph (ctx.gm)")
    hpu = {n.name for n in recipe.nodes if n.placement == "hpu"}
    groups = CapabilityBasedPartitioner(ctx.gm, _OnHpu(hpu), allows_single_node_partition=True).propose_partitions()
    order = {n.name: i for i, n in enumerate(recipe.nodes)}
    members = sorted(([n.name for n in g.nodes] for g in groups), key=lambda ns: min(order[x] for x in ns))
    cluster_of = {name: cid for cid, names in enumerate(members) for name in names}
    nodes = [dataclasses.replace(n, cluster=cluster_of.get(n.name, -1)) for n in recipe.nodes]
    sizes = [len(names) for names in members]
    facts = dict(recipe.facts, clusters={"count": len(members), "sizes": sizes})
    return dataclasses.replace(recipe, nodes=nodes, facts=facts)
