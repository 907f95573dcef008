"""Plan memory: HBM for one bucket at its upper end — persistent tensors plus a planned intermediates arena.

Persistent bytes are the graph's inputs (parameters included), constants and outputs. Every other
buffer gets a lifetime from the schedule (its defining step to its last reader, readers of its
views included) and an offset in one arena (``arena.assign_offsets``). Views and tuple elements
own no memory; values that stay inside a fused kernel live on chip, not in the arena; an sdpa op
that is not fused materializes its score matrices as a workspace for its own step. An attention
called through ``gaudi.FusedSDPA`` without recompute saves its B×H×S×L probabilities for the
backward: persistent output bytes of the forward, input bytes of the backward (``saved_probs_bytes``).
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe, iter_refs
from .. import arena
from ..buffers import alias_roots, internal_values, saved_probs_bytes, sdpa_workspace_bytes
from ..context import LoweringContext
from ...targets import device
from ..values import nbytes, node_refs, spec_map


def plan_memory(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    env = recipe.facts["plan_at"]
    roots = alias_roots(recipe)
    persistent = _persistent(recipe, roots)
    nodes = recipe.node_map()
    sizes = {r: nbytes(nodes[r[0]].out[r[1]], env) for r in roots
             if roots[r] == r and r not in persistent and r[0] in nodes}
    on_chip = internal_values(recipe, roots) & set(sizes)
    specs = spec_map(recipe)
    buffers = _lifetimes(recipe, roots, sizes, on_chip) + _workspaces(recipe, env, specs)
    offsets, arena_bytes = arena.assign_offsets(buffers)
    saved_probs = sum(saved_probs_bytes(recipe, n, specs, env) for n in recipe.nodes)
    persistent_bytes = _persistent_bytes(recipe, nodes, persistent, env, saved_probs)
    memory = {
        "estimate": True, "plan_at": dict(env), **persistent_bytes,
        "intermediate_bytes": sum(b.size for b in buffers),
        "arena_bytes": arena_bytes, "peak_live_bytes": arena.peak_live(buffers),
        "peak_bytes": persistent_bytes["persistent_bytes"] + arena_bytes,
        "on_chip_bytes": sum(sizes[r] for r in on_chip),
        "saved_probs_bytes": saved_probs,
        "workspace_bytes": max((b.size for b in buffers if b.name.startswith("workspace:")), default=0),
        "buffers": [[b.name, offsets[b.name], b.size, b.first, b.last] for b in buffers],
    }
    memory["fits_hbm"] = memory["peak_bytes"] <= device(recipe.target).hbm_bytes
    return dataclasses.replace(recipe, facts=dict(recipe.facts, memory=memory))


def _persistent(recipe: Recipe, roots) -> set:
    """Buffers that outlive the graph: its outputs (inputs and constants are counted apart)."""
    return {roots[(ref, 0)] for ref in iter_refs(recipe.outputs) if (ref, 0) in roots}


def _persistent_bytes(recipe: Recipe, nodes, persistent: set, env, saved_probs: int) -> dict:
    """Inputs, constants and outputs; FusedSDPA's saved probabilities are a forward's output, a backward's input."""
    inputs = sum(nbytes(s, env) for s in recipe.inputs) + sum(
        len(c.data) for c in recipe.constants.values())
    outputs = sum(nbytes(nodes[r[0]].out[r[1]], env) for r in persistent if r[0] in nodes)
    if recipe.kind == "forward":
        outputs += saved_probs
    else:
        inputs += saved_probs
    return {"input_bytes": inputs, "output_bytes": outputs, "persistent_bytes": inputs + outputs}


def _lifetimes(recipe: Recipe, roots, sizes: dict, on_chip: set) -> list[arena.Buffer]:
    outputs = {n.name: len(n.out) for n in recipe.nodes}
    first = {(n.name, k): i for i, n in enumerate(recipe.nodes) for k in range(len(n.out)) if (n.name, k) in sizes}
    last = dict(first)
    for i, node in enumerate(recipe.nodes):
        for ref in node_refs(node):
            for k in _read_outputs(node, ref, outputs):
                root = roots.get((ref, k))
                if root in last:
                    last[root] = i
    return [arena.Buffer(f"{r[0]}:{r[1]}", sizes[r], first[r], last[r]) for r in sizes if r not in on_chip]


def _read_outputs(node, ref: str, outputs: dict[str, int]) -> range:
    """Which outputs of ``ref`` a node reads: a tuple element reads one; other ops read them all."""
    if node.op == "operator::getitem" and len(node.args) > 1 and isinstance(node.args[1], int):
        return range(node.args[1], node.args[1] + 1)
    return range(outputs.get(ref, 1))


def _workspaces(recipe: Recipe, env, specs) -> list[arena.Buffer]:
    out = []
    for i, node in enumerate(recipe.nodes):
        size = sdpa_workspace_bytes(node, specs, env) if node.fusion < 0 else 0
        if size:
            out.append(arena.Buffer(f"workspace:{node.name}", size, i, i))
    return out
