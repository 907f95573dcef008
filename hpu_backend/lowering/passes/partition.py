"""Partition: group HPU nodes into clusters (one device graph each); CPU fallbacks split clusters.

A node's level is the largest number of CPU-fallback nodes on any path from the graph inputs to
it. HPU nodes of one level form one cluster, as the bridge accumulates every device op between
two host synchronizations into one graph. Levels never decrease along an edge and grow at each
CPU node, so a path can only go from a cluster to a later one: the cluster graph is acyclic by
construction, and the pass is linear in the graph (torch.fx's ``CapabilityBasedPartitioner``
finds the same clusters here but grows quadratically with depth; see bench/lowering_bench.py).
Host scalar ops and tuple elements belong to their level's cluster. Ids follow schedule order.

``Settings.max_compound_op_size`` (``PT_HPU_MAX_COMPOUND_OP_SIZE``, 0: no limit) caps the nodes of one
cluster, as the bridge caps the graphs it hands the graph compiler: a level's nodes are cut, in schedule
order, into clusters of at most that many. A chunk reads only earlier chunks, so the cluster graph stays
acyclic.
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..context import LoweringContext
from ..values import node_refs, with_fields


def partition(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    levels = _levels(recipe)
    cap = ctx.settings.max_compound_op_size
    ids: dict[tuple[int, int], int] = {}
    placed: dict[int, int] = {}  # level -> its device nodes so far
    nodes = []
    for n in recipe.nodes:
        cluster = -1
        if n.placement != "cpu":
            level = levels[n.name]
            count = placed[level] = placed.get(level, 0) + 1
            cluster = ids.setdefault((level, (count - 1) // cap if cap else 0), len(ids))
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
