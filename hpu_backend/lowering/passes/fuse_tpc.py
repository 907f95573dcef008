"""Fuse TPC chains: elementwise producer–consumer chains and reduction pro/epilogues become one kernel.

A consumer joins its producer's kernel when both run on the TPC in the same cluster and share an
iteration space: elementwise after elementwise on the same element count, a reduction reading
an elementwise result of its input's size (prologue), or elementwise on a reduction's result
(epilogue). Views between them are looked through and join the kernel as aliases. A node joins
only a kernel whose every other input it does not depend on through outside nodes, so the
kernel graph stays acyclic. Attention kernels (``fuse_attention``) are left alone.
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..context import LoweringContext
from ..graphview import GraphView
from ..optable import FUSIBLE_KINDS, shared_table
from ..values import numel_key, with_fields


def fuse_tpc(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    if not ctx.settings.fusion:
        return recipe
    view = GraphView(recipe)
    kinds = _kinds(recipe)
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for node in recipe.nodes:
        if node.name in kinds:
            _join(view, kinds, node.name, group_of, groups)
    return _record(recipe, view, kinds, [g for g in groups if sum(m in kinds for m in g) > 1])


def _kinds(recipe: Recipe) -> dict[str, str]:
    """Fusible nodes → their kind (elementwise | reduction | softmax)."""
    table = shared_table()
    out = {}
    for n in recipe.nodes:
        record = table.lookup(n.op)
        if (n.placement == "hpu" and n.engine == "tpc" and n.fusion < 0 and record is not None
                and record.kind in FUSIBLE_KINDS and len(n.out) == 1):
            out[n.name] = record.kind
    return out


def _join(view: GraphView, kinds, name: str, group_of: dict[str, int], groups: list[list[str]]) -> None:
    for ref in view.inputs[name]:
        producer, views = _through_views(view, ref)
        gid = group_of.get(producer)
        if producer in kinds and _same_space(view, kinds, producer, name) and \
                view.nodes[producer].cluster == view.nodes[name].cluster:
            if gid is None:
                gid = len(groups)
                groups.append([producer])
                group_of[producer] = gid
            if _acyclic(view, groups[gid], views, name):
                for m in [*views, name]:
                    group_of[m] = gid
                    groups[gid].append(m)
                return


def _through_views(view: GraphView, ref: str) -> tuple[str, list[str]]:
    """The nearest non-view producer of ``ref`` and the view nodes passed on the way."""
    views = []
    while ref in view.nodes and view.nodes[ref].engine == "view" and view.inputs[ref]:
        views.append(ref)
        ref = view.inputs[ref][0]
    return ref, views[::-1]


def _same_space(view: GraphView, kinds, producer: str, consumer: str) -> bool:
    out = numel_key(view.nodes[producer].out[0].shape)
    if kinds[consumer] == "elementwise":
        return numel_key(view.nodes[consumer].out[0].shape) == out
    # A reduction (or softmax) takes the producer as its prologue when it reads that many elements.
    return kinds[producer] == "elementwise"


def _acyclic(view: GraphView, group: list[str], views: list[str], name: str) -> bool:
    """Every other input of the newcomers is scheduled before the kernel starts (so cannot depend on it)."""
    members = set(group) | set(views)
    first = min(view.order[m] for m in group)
    return all(view.order[i] < first for m in [*views, name] for i in view.inputs[m] if i not in members)


def _record(recipe: Recipe, view: GraphView, kinds, groups: list[list[str]]) -> Recipe:
    fusions = list(recipe.facts.get("fusions", []))
    fusion_of = {}
    for members in groups:
        fid = len(fusions)
        reduces = any(kinds.get(m) in ("reduction", "softmax") for m in members)
        ordered = sorted(members, key=view.order.get)
        fusions.append({"id": fid, "kind": "tpc_reduction" if reduces else "tpc_elementwise",
                        "nodes": ordered, "cluster": view.nodes[ordered[0]].cluster})
        fusion_of.update(dict.fromkeys(members, fid))
    nodes = [with_fields(n, fusion=fusion_of[n.name]) if n.name in fusion_of else n for n in recipe.nodes]
    return dataclasses.replace(recipe, nodes=nodes, facts=dict(recipe.facts, fusions=fusions))
