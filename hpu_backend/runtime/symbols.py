"""Reading a recipe's shape-symbol values from the call's arguments (SymInt inputs or tensor dims)."""

from __future__ import annotations

from typing import Callable


def symbol_reader(sources: list[list[int]]) -> Callable[[list], tuple] | None:
    """A function args → tuple of symbol values, for ``recipe.symbol_sources``; None if there are none."""
    if not sources:
        return None
    getters = [(lambda a, i=i: a[i]) if d < 0 else (lambda a, i=i, d=d: a[i].shape[d]) for i, d in sources]
    if len(getters) == 1:
        g = getters[0]
        return lambda a: (g(a),)
    return lambda a: tuple(g(a) for g in getters)
