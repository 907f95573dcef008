"""Fuse attention: each call of a fused attention kernel becomes one FusedSDPA group, as on Gaudi.

The sdpa ops (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which
``F.scaled_dot_product_attention`` and ``gaudi.FusedSDPA`` reach, become a FusedSDPA group with their
tuple elements. Values that stay inside a group never reach HBM in the memory plan. The executor still
runs the individual ops: fusion changes the plan and the estimate, never the numerics. A group called
through ``gaudi.FusedSDPA`` records its ``recompute`` choice, which the memory plan and the estimate read.

Attention written out by hand, ``softmax(q @ kᵀ · scale [+ mask]) @ v`` (after decomposition: bmm,
view/expand/clone, mul/div, add, ``_softmax`` or amax-sub-exp-sum-div, bmm; and the mirror image in
backward around ``_softmax_backward_data``), is what the user's code runs: separate matmuls and a
softmax whose S×S scores go through HBM. It is not fused (the Gaudi graph compiler does not turn it
into FusedSDPA); it is recorded in ``facts["handwritten_attention"]`` (every node on the paths from the
score matmul to the output matmul(s), plus the layout ops that only prepare q, k and v), so that the
estimate can say what the fused call would save and the advisor can suggest it. A hand-written chain
annotated as a FusedSDPA call (``torch.fx.traceback.annotate({"hpu_fused_sdpa": {...}})``: a model that
stands for a fused kernel, such as a server's decode attention) is fused like the sdpa ops, and so is the
same chain decomposed from an ``F.scaled_dot_product_attention`` call (capture lists its nodes in
``facts["sdpa_calls"]``; torch takes the math path on the host for dropout in training): the user's code
calls the fused kernel, and Gaudi runs it as one.
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..buffers import recompute_choice
from ..context import LoweringContext
from ..graphview import GraphView
from ..optable import packet_name
from ..values import with_fields

SDPA = {"_scaled_dot_product_flash_attention_for_cpu": "fused_sdpa",
        "_scaled_dot_product_flash_attention_for_cpu_backward": "fused_sdpa_bwd",
        "_scaled_dot_product_efficient_attention": "fused_sdpa",
        "_scaled_dot_product_efficient_attention_backward": "fused_sdpa_bwd"}
SOFTMAX = {"_softmax": "fused_sdpa", "_softmax_backward_data": "fused_sdpa_bwd"}
MATMUL = {"bmm", "mm", "baddbmm"}
# Ops allowed between the matmuls and the softmax: scale, mask, dropout, casts and views.
THROUGH = {"view", "_unsafe_view", "expand", "clone", "permute", "transpose", "t", "unsqueeze",
           "squeeze", "alias", "mul", "div", "add", "sub", "where", "masked_fill", "_to_copy",
           "native_dropout", "getitem", "amax", "exp", "sum", "reshape"}
PREP = {"view", "_unsafe_view", "expand", "clone", "permute", "transpose", "t", "unsqueeze", "reshape"}
MAX_HOPS = 12


def fuse_attention(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    if not ctx.settings.fusion:
        return dataclasses.replace(recipe, facts=dict(recipe.facts, fusions=[]))
    view = GraphView(recipe)
    groups: list[tuple[str, list[str]]] = []
    handwritten: list[tuple[str, list[str]]] = []
    taken: set[str] = set()
    sdpa_calls = set(recipe.facts.get("sdpa_calls", ()))
    for node in recipe.nodes:
        found = _sdpa_group(view, node.name)
        by_hand = found is None and (found := _explicit_group(view, node.name)) is not None \
            and not _annotated(recipe, found[1]) and not sdpa_calls & set(found[1])
        if found and not (set(found[1]) & taken) and _one_cluster(view, found[1]):
            (handwritten if by_hand else groups).append((*found, node.name))
            taken.update(found[1])
    return _record(recipe, view, groups, handwritten)


def _packet(view: GraphView, name: str) -> str:
    return packet_name(view.nodes[name].op)


def _sdpa_group(view: GraphView, name: str):
    kind = SDPA.get(_packet(view, name))
    if kind is None:
        return None
    return kind, [name, *(u for u in view.users[name] if _packet(view, u) == "getitem")]


def _explicit_group(view: GraphView, name: str):
    kind = SOFTMAX.get(_packet(view, name)) or _decomposed_softmax(view, name)
    if kind is None:
        return None
    source = _find_matmul(view, name)
    sinks = _find_sinks(view, name)
    if source is None or not sinks:
        return None
    last = max(view.order[s] for s in sinks)
    between = view.descendants(source, last) & set().union(*(view.ancestors(s, view.order[source]) for s in sinks))
    members = {source, *sinks, *between}
    members |= _prep(view, members)
    return kind, sorted(members, key=view.order.get)


def _decomposed_softmax(view: GraphView, name: str) -> str | None:
    """``div(exp(x - amax(x)), sum(exp(...)))``: the softmax after decomposition."""
    if _packet(view, name) != "div" or len(view.inputs[name]) != 2:
        return None
    a, b = view.inputs[name]
    if _packet(view, a) == "exp" and _packet(view, b) == "sum" and view.inputs[b] == [a]:
        return "fused_sdpa"
    return None


def _find_matmul(view: GraphView, start: str) -> str | None:
    """The nearest matmul upstream of ``start`` through THROUGH ops (the score matmul)."""
    found = _matmuls_through(view, view.inputs[start][:1], view.inputs)
    return found[0] if found else None


def _find_sinks(view: GraphView, start: str) -> list[str]:
    """The matmuls downstream of the softmax through THROUGH ops (probabilities @ v)."""
    return _matmuls_through(view, list(view.users[start]), view.users)


def _matmuls_through(view: GraphView, frontier: list[str], edges) -> list[str]:
    """Matmuls reached from ``frontier`` along ``edges`` (inputs or users) via THROUGH ops, nearest first."""
    seen, found = set(), []
    for _ in range(MAX_HOPS):
        nxt = []
        for n in frontier:
            if n in seen:
                continue
            seen.add(n)
            p = _packet(view, n)
            if p in MATMUL:
                found.append(n)
            elif p in THROUGH:
                nxt.extend(edges[n])
        frontier = nxt
    return found


def _prep(view: GraphView, members: set[str]) -> set[str]:
    """Layout ops whose every reader is in the group: FusedSDPA reads q, k, v as they are."""
    added, todo = set(), [i for m in members for i in view.inputs[m] if i not in members]
    while todo:
        n = todo.pop()
        if n in added or n in members or _packet(view, n) not in PREP or n in view.outputs:
            continue
        if all(u in members or u in added for u in view.users[n]):
            added.add(n)
            todo.extend(view.inputs[n])
    return added


def _annotated(recipe: Recipe, names: list[str]) -> bool:
    """Whether a hand-written chain stands for a FusedSDPA call (an annotation on one of its nodes)."""
    return any(recompute_choice(recipe, node) is not None for node in recipe.nodes if node.name in names)


def _one_cluster(view: GraphView, names: list[str]) -> bool:
    nodes = [view.nodes[n] for n in names]
    return all(n.placement == "hpu" for n in nodes) and len({n.cluster for n in nodes}) == 1


def _record(recipe: Recipe, view: GraphView, groups, handwritten) -> Recipe:
    fusion_of = {m: i for i, (_, members, _) in enumerate(groups) for m in members}
    nodes = [with_fields(n, fusion=fusion_of[n.name]) if n.name in fusion_of else n for n in recipe.nodes]
    fusions = [{"id": i, "kind": kind, "nodes": members, "cluster": view.nodes[members[0]].cluster,
                **_recompute(recipe, view, members)} for i, (kind, members, _) in enumerate(groups)]
    by_hand = [{"kind": kind, "nodes": members, "cluster": view.nodes[members[0]].cluster,
                "source": view.nodes[softmax].source} for kind, members, softmax in handwritten]
    facts = dict(recipe.facts, fusions=fusions)
    if by_hand:
        facts["handwritten_attention"] = by_hand
    return dataclasses.replace(recipe, nodes=nodes, facts=facts)


def _recompute(recipe: Recipe, view: GraphView, members: list[str]) -> dict:
    """``{"recompute": bool}`` for a group called through FusedSDPA (its recompute_mode), else nothing."""
    choices = {recompute_choice(recipe, view.nodes[m]) for m in members} - {None}
    return {"recompute": choices.pop()} if len(choices) == 1 else {}
