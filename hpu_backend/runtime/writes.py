"""What a recipe writes, by the runtime: ``formats.writes``' reading plus what each op's schema marks.

Loading refuses a recipe whose ops write other inputs than it declares (``check_writes``); callers compare
the declaration with what they allow: a package nothing, a stored bucket what its graph's template writes.
"""

from __future__ import annotations

import functools

from ..formats import writes as _rules
from ..formats.recipe import Node, Recipe
from . import ops
from ..errors import HpuBackendError

HIDDEN_WRITES = _rules.HIDDEN_WRITES


class UndeclaredWrite(HpuBackendError, ValueError):
    """A recipe whose ops write an input it does not declare, or that declares writes its ops do not make."""


@functools.cache
def schema_writes(name: str) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments an allowlisted op's schema marks written; none for another name (the
    allowlist refuses it wherever a recipe is loaded)."""
    try:
        schema = getattr(ops.resolve(name), "_schema", None)
    except ops.OpNotAllowed:
        return ()
    if schema is None:
        return ()
    return tuple((i, a.name) for i, a in enumerate(schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def writes_anything(node: Node) -> bool:
    return _rules.writes_anything(node, schema_writes)


def written_inputs(recipe: Recipe) -> set[str]:
    return _rules.written_inputs(recipe, schema_writes)


def check_writes(recipe: Recipe) -> None:
    """UndeclaredWrite unless the inputs the recipe's ops write are exactly those it declares."""
    problem = _rules.declaration_problem(recipe, schema_writes)
    if problem:
        raise UndeclaredWrite(problem)
