"""Find transfers: the values that must cross the host link because a neighbour runs on the other side.

Graph inputs and outputs live on the HPU. A tensor read on the other side of where it was made
is copied once per direction (the bridge caches the copy for later readers). Sizes come later,
per bucket, in ``size_transfers``.
"""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe, iter_refs
from ..context import LoweringContext
from ..values import is_tensor_value, node_refs, spec_map


def find_transfers(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    specs = spec_map(recipe)
    where = {name: "hpu" for name in [*recipe.input_names, *recipe.constants]}
    moves: dict[tuple[str, str], None] = {}
    for node in recipe.nodes:
        where[node.name] = node.placement
        if node.engine == "host":
            continue  # scalars travel with the launch, not over the DMA link
        for ref in node_refs(node):
            if is_tensor_value(specs.get(ref)) and where.get(ref, "hpu") != node.placement:
                moves[(ref, node.placement)] = None
    for ref in iter_refs(recipe.outputs):
        if where.get(ref) == "cpu" and is_tensor_value(specs.get(ref)):
            moves[(ref, "hpu")] = None
    transfers = [{"value": v, "to": to} for v, to in moves]
    return dataclasses.replace(recipe, facts=dict(recipe.facts, transfers=transfers))
