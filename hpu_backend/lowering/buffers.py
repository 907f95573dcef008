"""Which values own memory: views and tuple elements alias their base; fused values may stay on chip.

Shared by the memory plan and the cost model, so the two always agree on what touches HBM. Also
what FusedSDPA's recompute choice saves: without recompute the forward keeps its B×H×S×L
probabilities in HBM for the backward, with it the backward recomputes them on chip.
"""

from __future__ import annotations

from typing import Mapping

from ..formats.recipe import Node, Recipe, ValueSpec, iter_refs
from .optable import packet_name
from .values import nbytes, node_refs

SDPA_FORWARD = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention"}
SDPA_BACKWARD = {"_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_scaled_dot_product_efficient_attention_backward"}

# node.meta["custom"] key that hpu_backend.gaudi.FusedSDPA sets; capture records it in facts["annotations"].
FUSED_SDPA_ANNOTATION = "hpu_fused_sdpa"

Root = tuple[str, int]  # (value that owns the memory, output index)


def alias_roots(recipe: Recipe) -> dict[Root, Root]:
    """(value, output index) → the (value, index) whose memory it is; owners map to themselves."""
    roots: dict[Root, Root] = {(n, 0): (n, 0) for n in [*recipe.input_names, *recipe.constants]}
    for node in recipe.nodes:
        refs = node_refs(node)
        for k in range(len(node.out)):
            roots[(node.name, k)] = _root_of(node, k, refs, roots)
    return roots


def _root_of(node: Node, k: int, refs: list[str], roots: dict[Root, Root]) -> Root:
    if node.engine != "view" or not refs:
        return (node.name, k)
    if node.op == "operator::getitem" and len(node.args) > 1 and isinstance(node.args[1], int):
        return roots.get((refs[0], node.args[1]), (node.name, k))
    return roots.get((refs[0], 0), (node.name, k))  # a view op: every output aliases its input


def internal_values(recipe: Recipe, roots: Mapping[Root, Root]) -> set[Root]:
    """Buffers made inside a fused kernel and read only inside it: they never reach HBM."""
    fusion_of = {n.name: n.fusion for n in recipe.nodes}
    escaped: set[Root] = {roots[r] for r in _output_roots(recipe, roots)}
    for node in recipe.nodes:
        for ref in node_refs(node):
            root = roots.get((ref, 0))
            if root is not None and fusion_of.get(root[0], -1) != node.fusion:
                escaped.add(root)
    return {r for r, owner in roots.items() if r == owner and fusion_of.get(r[0], -1) >= 0 and r not in escaped}


def _output_roots(recipe: Recipe, roots) -> list[Root]:
    return [(ref, 0) for ref in iter_refs(recipe.outputs) if (ref, 0) in roots]


def sdpa_scores_bytes(node: Node, specs: Mapping[str, list[ValueSpec]], env: Mapping[str, int]) -> int:
    """Bytes of one B×H×S×L score matrix of an sdpa op (what an unfused attention materializes)."""
    packet = packet_name(node.op)
    if packet not in SDPA_FORWARD | SDPA_BACKWARD:
        return 0
    q, k = sdpa_operands(node, specs)[:2]
    scores = ValueSpec(kind="tensor", dtype=q.dtype, shape=[*q.shape[:-1], k.shape[-2]])
    return nbytes(scores, env)


def sdpa_operands(node: Node, specs: Mapping[str, list[ValueSpec]]) -> list[ValueSpec]:
    """The query, key and value of an sdpa op, by argument position: self-attention may pass one value
    three times, which the node's (deduplicated) reads list once."""
    offset = 1 if packet_name(node.op) in SDPA_BACKWARD else 0  # backward starts with grad_out
    refs = [a.get("r") if isinstance(a, dict) else None for a in node.args[offset:offset + 3]]
    return [specs[r][0] for r in refs if r is not None]


def sdpa_workspace_bytes(node: Node, specs, env) -> int:
    """Unfused attention keeps scores and probabilities (forward) or P, dP and dS (backward) at once."""
    scores = sdpa_scores_bytes(node, specs, env)
    if not scores:
        return 0
    return scores * (3 if packet_name(node.op) in SDPA_BACKWARD else 2)


def recompute_choice(recipe: Recipe, node: Node) -> bool | None:
    """FusedSDPA's recompute_mode for this attention op (None: plain sdpa, not called through FusedSDPA)."""
    note = recipe.facts.get("annotations", {}).get(node.name, {}).get(FUSED_SDPA_ANNOTATION)
    return None if note is None else bool(note.get("recompute"))


def saved_probs_bytes(recipe: Recipe, node: Node, specs, env) -> int:
    """Bytes of the probabilities a training forward saves for its backward (FusedSDPA without recompute)."""
    if recipe.kind == "inference" or recompute_choice(recipe, node) is not False:
        return 0
    return sdpa_scores_bytes(node, specs, env)
