"""A recipe's symbolic nodes evaluated before any call: what the first call would compute, checked at load.

The runtime's symbolic ops are bounded (``ops.SYM_RUNTIME``: no integer past MAX_BITS bits, no list or string
repeated or joined past MAX_ITEMS items), so evaluating every node whose operands are known here (literals,
values computed before it, symbol values the caller gives) does bounded work, and a bound broken, an index
out of range or a wrong operand is found when the entry is loaded: a cache entry is quarantined and a
package refused in one line, instead of a traceback at the first call.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..formats import symexpr
from ..formats.recipe import Recipe, ValueSpec
from . import ops
from ..errors import HpuBackendError

_EFFECTS = "higher_order::with_effects"


class SymbolicError(HpuBackendError, ValueError):
    """A symbolic node that cannot be computed: a bound broken, an index out of range, a wrong operand."""


class _Unknown:
    """A value only a call knows (a tensor, a symbol without a value here)."""


UNKNOWN = _Unknown()


def symbolic_values(recipe: Recipe, env: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The values of the recipe's symbolic nodes that can be computed from literals and ``env`` (symbol values;
    None: none known), by the runtime's bounded ops; SymbolicError naming the node for one that fails."""
    known: dict[str, Any] = {}
    shapes: dict[str, ValueSpec] = {}
    for name, spec in zip(recipe.input_names, recipe.inputs):
        if spec.kind == "sym" and spec.expr is not None and env is not None:
            known[name] = _tree(spec.expr, env, name)
        shapes[name] = spec
    made_by: dict[str, str] = {}  # node name -> its op
    for node in recipe.nodes:
        shapes[node.name] = node.out[0] if node.out else ValueSpec("none")
        made_by[node.name] = node.op
        try:
            _check_item(node, made_by)
            value = _node_value(node, known, shapes, env)
        except SymbolicError:
            raise
        except (ArithmeticError, TypeError, ValueError, LookupError, RecursionError, AssertionError) as e:
            # (torch.sym_max and its kin assert their operands are numbers)
            raise SymbolicError(f"node {node.name!r:.40} ({node.op}): {type(e).__name__}: {str(e)[:120]}") from None
        if value is not UNKNOWN:
            known[node.name] = value
    return known


def _node_value(node, known: dict, shapes: dict, env) -> Any:
    if node.op == "aten::sym_size.int" and len(node.args) == 2 and isinstance(node.args[0], dict):
        shape = shapes.get(node.args[0].get("r"), ValueSpec("none")).shape
        dim = node.args[1]
        if type(dim) is not int or not -len(shape) <= dim < len(shape):
            raise SymbolicError(f"node {node.name!r:.40}: dimension {dim!r:.20} of a value with {len(shape)}")
        return _tree(shape[dim], env, node.name) if env is not None else UNKNOWN
    if node.op not in ops.SYM_RUNTIME or node.op == _EFFECTS:
        return UNKNOWN
    args = [_operand(a, known) for a in node.args]
    if any(a is UNKNOWN for a in args) or node.kwargs:
        return UNKNOWN
    fn: Callable = ops.resolve(node.op)
    return fn(*args)


def _check_item(node, made_by: dict[str, str]) -> None:
    """An item taken from an op's results names one it returns (an op returning a list of tensors, such as
    split, has as many as its values say: the call checks those)."""
    if node.op != "operator::getitem" or len(node.args) != 2 or not isinstance(node.args[0], dict):
        return
    op = made_by.get(node.args[0].get("r"), "")
    schema = getattr(ops.resolve(op), "_schema", None) if op and op not in ops.SYM_RUNTIME else None
    if schema is None or any("[" in str(r.type) for r in schema.returns):
        return
    index = node.args[1]
    if type(index) is not int or not 0 <= index < len(schema.returns):
        raise SymbolicError(f"node {node.name!r:.40} takes item {index!r:.20} of {op}, which returns "
                            f"{len(schema.returns)}")


def _operand(a: Any, known: dict) -> Any:
    """A literal operand as it is, a reference as the value computed for it; UNKNOWN otherwise."""
    if isinstance(a, dict):
        return known.get(a["r"], UNKNOWN) if set(a) == {"r"} else UNKNOWN
    if isinstance(a, list):
        items = [_operand(x, known) for x in a]
        return UNKNOWN if any(x is UNKNOWN for x in items) else items
    return a


def _tree(tree: Any, env: Mapping[str, int], where: str) -> Any:
    try:
        return symexpr.evaluate(tree, env)
    except symexpr.SymExprError as e:
        raise SymbolicError(f"{where}: {e}") from None
