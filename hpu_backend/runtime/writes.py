"""What a recipe writes: the inputs its ops write into, from what each op does, not only what its schema says.

A schema marks the arguments an op writes (``Tensor(a!)``), but some kernels write arguments their schema
leaves unmarked: batch norm in training mode updates the running statistics it is given, whatever the
spelling (``HIDDEN_WRITES``). The generated bindings also take an ``out=`` that the overload's schema does
not list. A value written is traced back to the inputs it may share memory with through *every* op before
it (a view, an ``_unsafe_view`` that returns an alias unannotated, a tuple item): recipes lowered here write
only into graph inputs themselves (AOTAutograd's mutated buffers, lazy mode's write-backs), so nothing
legitimate is lost by assuming any op may alias.

A recipe declares the inputs it writes (``Recipe.writes``, set by capture from these same rules); loading
refuses a recipe whose ops write anything else (``check_writes``), and callers compare the declaration
with what they allow: a package allows nothing, a stored bucket what its graph's template writes.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

from ..formats.recipe import Node, Recipe, iter_refs
from . import ops

# Ops that write arguments their schema does not mark: packet -> (argument names written, the flag that turns
# the writes on; None: always). Kept by a test that runs each one and by the sweep that found them.
HIDDEN_WRITES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "native_batch_norm": (("running_mean", "running_var"), "training"),
    "batch_norm": (("running_mean", "running_var"), "training"),
    "_batch_norm_impl_index": (("running_mean", "running_var"), "training"),
    "cudnn_batch_norm": (("running_mean", "running_var"), "training"),
    "miopen_batch_norm": (("running_mean", "running_var"), "training"),
    "instance_norm": (("running_mean", "running_var"), "use_input_stats"),
    "batch_norm_update_stats": (("running_mean", "running_var"), None),
}


class UndeclaredWrite(ValueError):
    """A recipe whose ops write an input it does not declare, or that declares writes its ops do not make."""


@functools.cache
def _schema_facts(name: str) -> tuple[tuple[str, ...], frozenset[int], tuple[tuple[str, ...], str | None]] | None:
    """(argument names, positions the schema marks written, hidden writes) of an op; None for symbolic
    arithmetic. OpNotAllowed for a name outside the allowlist."""
    schema = getattr(ops.resolve(name), "_schema", None)
    if schema is None:
        return None
    marked = frozenset(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    packet = name.partition("::")[2].rpartition(".")[0]
    return tuple(a.name for a in schema.arguments), marked, HIDDEN_WRITES.get(packet, ((), None))


def written_values(node: Node) -> list[Any]:
    """The argument values an op writes into (tagged references, literals), ``with_effects``' inner op too."""
    if node.op == "higher_order::with_effects":  # with_effects(token, op, *args): the inner op's writes
        inner = node.args[1] if len(node.args) > 1 else None
        if isinstance(inner, dict) and isinstance(inner.get("op"), str):
            return _writes(inner["op"], list(node.args[2:]), node.kwargs)
        return []
    return _writes(node.op, list(node.args), node.kwargs)


def _writes(op: str, args: list, kwargs: dict) -> list[Any]:
    facts = _schema_facts(op)
    if facts is None:
        return []
    names, marked, (hidden, flag) = facts
    bound = dict(zip(names, args)) | kwargs
    found = [bound[names[i]] for i in marked if names[i] in bound]
    if hidden and (flag is None or bound.get(flag, True) is not False):  # only a literal False turns them off
        found += [bound[n] for n in hidden if bound.get(n) is not None]
    if "out" in kwargs:  # the binding's out=, listed by the schema or not
        found.append(kwargs["out"])
    return found


def writes_anything(node: Node) -> bool:
    return bool(written_values(node))


def written_inputs(recipe: Recipe) -> set[str]:
    """The recipe's inputs its ops write into, directly or through any value computed from them."""
    inputs = set(recipe.input_names)
    roots: dict[str, frozenset[str]] = {name: frozenset([name]) for name in inputs}
    written: set[str] = set()
    for node in recipe.nodes:
        for value in written_values(node):
            written |= set().union(*(roots.get(r, frozenset()) for r in _refs(value)))
        roots[node.name] = frozenset().union(*(roots.get(r, frozenset()) for r in _refs([node.args, node.kwargs])))
    return written & inputs


def _refs(value: Any) -> Iterator[str]:
    return iter_refs([value] if not isinstance(value, list) else value)


def check_writes(recipe: Recipe) -> None:
    """UndeclaredWrite unless the inputs the recipe's ops write are exactly those it declares."""
    actual, declared = written_inputs(recipe), set(recipe.writes)
    if actual - declared:
        raise UndeclaredWrite(f"recipe {recipe.name!r:.60} writes input(s) {sorted(actual - declared)!r:.120} "
                              "it does not declare")
    if declared - actual:
        raise UndeclaredWrite(f"recipe {recipe.name!r:.60} declares writes to {sorted(declared - actual)!r:.120} "
                              "its ops do not make")
