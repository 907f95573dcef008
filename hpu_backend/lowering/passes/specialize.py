"""Specialize: bind a symbolic recipe to one shape bucket; later passes plan at the bucket's upper end."""

from __future__ import annotations

import dataclasses

from ...formats.recipe import Recipe
from ..context import LoweringContext
from ..errors import LoweringError


def specialize(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    missing = [s for s in recipe.symbols if s not in ctx.bucket]
    if missing:
        raise LoweringError(f"no bucket given for shape symbols {missing}")
    bucket = {s: list(ctx.bucket[s]) for s in recipe.symbols}
    facts = dict(recipe.facts, plan_at={s: hi for s, (_, hi) in bucket.items()})
    return dataclasses.replace(recipe, bucket=bucket, facts=facts)
