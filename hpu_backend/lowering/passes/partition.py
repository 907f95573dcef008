"""Partition: group HPU nodes into clusters (one device graph each); CPU fallbacks split clusters.

A node's level is the largest number of CPU-fallback nodes on any path from the graph inputs to
it. HPU nodes of one level form one cluster, as the bridge accumulates every device op between
two host synchronizations into one graph. Levels never decrease along an edge and grow at each
CPU node, so a path can only go from a cluster to a later one: the cluster graph is acyclic by
construction, and the pass is linear in the graph (torch.fx's ``CapabilityBasedPartitioner``
finds the same clusters here but grows quadratically with depth; see bench/lowering_bench.py).
Host scalar ops and tuple elements belong to their level's cluster. Ids follow schedule order.
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..context import LoweringContext
from ..values import node_refs, with_fields


def partition(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    levels = _levels(recipe)
    ids: dict[int, int] = {}
    nodes = []
    for n in recipe.nodes:
        cluster = -1 if n.placement == "cpu" else ids.setdefault(levels[n.name], len(ids))
        nodes.append(with_fields(n, cluster=cluster))
    sizes = [0] * len(ids)
    for n in nodes:
        if n.cluster >= 0:
            sizes[n.cluster] += 1
    facts = dict(recipe.facts, clusters={"count": len(ids), "sizes": sizes})
    return dataclasses.replace(recipe, nodes=nodes, facts=facts)


def _levels(recipe: Recipe) -> dict[str, int]:
    """Per node: the most CPU nodes on a path from the inputs to it (a CPU node counts for its readers)."""
    level: dict[str, int] = {}
    after: dict[str, int] = {}  # the level a reader of this value starts from
    for n in recipe.nodes:
        level[n.name] = max((after[r] for r in node_refs(n) if r in after), default=0)
        after[n.name] = level[n.name] + (1 if n.placement == "cpu" else 0)
    return level
