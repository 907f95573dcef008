"""Size transfers: the bytes each host↔device copy found by ``find_transfers`` moves, at the bucket's upper end."""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..context import LoweringContext
from ..values import nbytes, spec_map


def size_transfers(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    env = recipe.facts["plan_at"]
    specs = spec_map(recipe)
    items = [{"value": t["value"], "to": t["to"],
              "bytes": sum(nbytes(s, env) for s in specs.get(t["value"], []))}
             for t in recipe.facts.get("transfers", [])]
    summary = {"count": len(items), "bytes": sum(i["bytes"] for i in items), "items": items}
    return dataclasses.replace(recipe, facts=dict(recipe.facts, host_transfers=summary))
