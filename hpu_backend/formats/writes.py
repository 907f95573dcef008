"""What a recipe writes, read from its ops without torch: the inputs an entry must declare (``Recipe.writes``).

An op writes the arguments its schema marks (``Tensor(a!)``), but some kernels also write arguments their
schema leaves unmarked: batch norm in training mode updates the running statistics it is given, whatever
the spelling (``HIDDEN_WRITES``); and the generated bindings take an ``out=`` that the overload's schema
may not list. Without torch (``hpurecipe verify`` reads the cache without it) the marked arguments are known
by the naming rules ATen keeps: an in-place op (``copy_``, ``add_``, ``__iand__``) writes its first argument,
an ``out`` overload its keyword arguments. The runtime adds what the schema marks (``runtime/writes.py``); the
runtime's allowlist admits no other mutating op, so both read the same writes from any recipe it would run.

A value written is traced back to the inputs it may share memory with through *every* op before it (a
view, an ``_unsafe_view`` that returns an alias unannotated, a tuple item): recipes lowered here write only
into graph inputs themselves (AOTAutograd's mutated buffers, lazy mode's write-backs), so assuming any op
may alias loses nothing legitimate.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from .recipe import Node, Recipe, iter_refs

_STATS = ((3, "running_mean"), (4, "running_var"))

# Ops that write arguments their schema does not mark: packet -> ((position, name) written, (position, name)
# of the flag that turns the writes on, or None: always). Kept honest by a test that runs each one.
HIDDEN_WRITES: dict[str, tuple[tuple[tuple[int, str], ...], tuple[int, str] | None]] = {
    "native_batch_norm": (_STATS, (5, "training")),
    "batch_norm": (_STATS, (5, "training")),
    "_batch_norm_impl_index": (_STATS, (5, "training")),
    "cudnn_batch_norm": (_STATS, (5, "training")),
    "miopen_batch_norm": (_STATS, (5, "training")),
    "instance_norm": (_STATS, (5, "use_input_stats")),
    "batch_norm_update_stats": (((1, "running_mean"), (2, "running_var")), None),
}

# (op name) -> the (position, name) of the arguments its schema marks written; None: not known here.
SchemaWrites = Callable[[str], Iterable[tuple[int, str]] | None]


def _split(op: str) -> tuple[str, str]:
    rest = op.partition("::")[2]
    packet, _, overload = rest.rpartition(".")
    return packet, overload


def named_writes(op: str) -> list[tuple[int, str]]:
    """The arguments ATen's naming rules say an op writes: an in-place op its first (``self``)."""
    packet, _ = _split(op)
    in_place = (packet.endswith("_") and not packet.endswith("__")) or packet.startswith("__i")
    return [(0, "self")] if in_place else []


def written_values(node: Node, schema_writes: SchemaWrites | None = None) -> list[Any]:
    """The argument values an op writes into (tagged references, literals), ``with_effects``' inner op too."""
    if node.op == "higher_order::with_effects":  # with_effects(token, op, *args): the inner op's writes
        inner = node.args[1] if len(node.args) > 1 else None
        if isinstance(inner, dict) and isinstance(inner.get("op"), str):
            return _writes(inner["op"], list(node.args[2:]), node.kwargs, schema_writes)
        return []
    return _writes(node.op, list(node.args), node.kwargs, schema_writes)


def _arg(args: list, kwargs: dict, position: int, name: str, default: Any = None) -> Any:
    return args[position] if position < len(args) else kwargs.get(name, default)


def _writes(op: str, args: list, kwargs: dict, schema_writes: SchemaWrites | None) -> list[Any]:
    marked = set(named_writes(op)) | set((schema_writes and schema_writes(op)) or ())
    found = [_arg(args, kwargs, i, name) for i, name in sorted(marked)]
    hidden, flag = HIDDEN_WRITES.get(_split(op)[0], ((), None))
    if hidden and (flag is None or _arg(args, kwargs, *flag, default=True) is not False):  # a literal False: off
        found += [_arg(args, kwargs, i, name) for i, name in hidden]
    if "out" in _split(op)[1]:  # an out= overload writes its keyword-only results (out, out0, save_mean, ...)
        found += list(kwargs.values())
    elif "out" in kwargs:  # the binding's out=, listed by the schema or not
        found.append(kwargs["out"])
    return [v for v in found if v is not None]


def writes_anything(node: Node, schema_writes: SchemaWrites | None = None) -> bool:
    return bool(written_values(node, schema_writes))


def written_inputs(recipe: Recipe, schema_writes: SchemaWrites | None = None) -> set[str]:
    """The recipe's inputs its ops write into, directly or through any value computed from them."""
    roots: dict[str, frozenset[str]] = {name: frozenset([name]) for name in recipe.input_names}
    written: set[str] = set()
    for node in recipe.nodes:
        for value in written_values(node, schema_writes):
            written |= _roots(value, roots)
        roots[node.name] = _roots([node.args, list(node.kwargs.values())], roots)
    return written & set(recipe.input_names)


def _roots(value: Any, roots: dict[str, frozenset[str]]) -> frozenset[str]:
    return frozenset().union(*(roots.get(r, frozenset()) for r in _refs(value)))


def _refs(value: Any) -> Iterator[str]:
    return iter_refs([value])


def declaration_problem(recipe: Recipe, schema_writes: SchemaWrites | None = None) -> str | None:
    """Why the inputs a recipe's ops write differ from those it declares (``Recipe.writes``), or None."""
    actual, declared = written_inputs(recipe, schema_writes), set(recipe.writes)
    if actual - declared:
        return (f"recipe {recipe.name!r:.60} writes input(s) {sorted(actual - declared)!r:.120} it does not "
                "declare")
    if declared - actual:
        return f"recipe {recipe.name!r:.60} declares writes to {sorted(declared - actual)!r:.120} its ops do not make"
    return None
