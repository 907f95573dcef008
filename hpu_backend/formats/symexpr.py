"""Symbolic integer expressions as plain data: sympy in, nested lists out, evaluated without eval().

A recipe stores shapes and guards that depend on the graph's size symbols (``s0``, ``s1``...).
They are kept as small trees — an int, a symbol name, or ``[op, *operands]`` with ``op`` from a
fixed table — so a recipe read from disk can be evaluated on plain integers by the interpreter
below, and never by ``eval`` or ``sympy.sympify`` of stored text.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Mapping, Union
from ..errors import HpuBackendError

Tree = Union[int, float, bool, str, list]

_SYMBOL = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_BITS = 4096  # no size, stride or guard needs integers this large; stored trees cannot ask for more work
MAX_ITEMS = 4096  # no symbolic operation of a graph makes a longer list or string
MAX_NODES = 4096  # no guard, size or stride of a graph is a larger tree: evaluating one stays cheap
MAX_DEPTH = 64  # nor a deeper one (the evaluator and to_str recurse over it)


class SymExprError(HpuBackendError, ValueError):
    """An expression that cannot be encoded, or a stored tree that is not well-formed."""


def _floordiv(a, b):
    return a // b


def _ceildiv(a, b):
    return -(-a // b)


def _and(*xs):
    return all(xs)


def _or(*xs):
    return any(xs)


def _sum(*xs):
    return functools.reduce(bounded_add, xs, 0)


def _prod(*xs):
    return functools.reduce(bounded_mul, xs, 1)


# Every operation's result is bounded before it is computed: integers by MAX_BITS, sequences (a list or string
# repeated or concatenated by the runtime's symbolic ops) by MAX_ITEMS. Each result is then an operand of
# bounded size, so a chain of operations does bounded work per step whatever its length.
_SEQUENCES = (str, bytes, list, tuple)


def _big(x) -> bool:
    return isinstance(x, int) and x.bit_length() > MAX_BITS


def _too_long(n) -> bool:
    return n > MAX_ITEMS


def bounded_mul(a, b):
    """``a * b``; OverflowError, before computing, for an integer of more than MAX_BITS bits or a sequence
    repeated past MAX_ITEMS items."""
    if isinstance(a, int) and isinstance(b, int):
        if a and b and a.bit_length() + b.bit_length() - 1 > MAX_BITS:
            raise OverflowError(f"an integer product of more than {MAX_BITS} bits")
    elif isinstance(a, _SEQUENCES) or isinstance(b, _SEQUENCES):
        seq, n = (a, b) if isinstance(a, _SEQUENCES) else (b, a)
        if isinstance(n, int) and _too_long(len(seq) * max(n, 0)):
            raise OverflowError(f"a sequence repeated past {MAX_ITEMS} items")
    return operator.mul(a, b)


def bounded_add(a, b):
    """``a + b``; OverflowError for operands past the bounds, or two sequences joined past MAX_ITEMS items."""
    if _big(a) or _big(b):
        raise OverflowError(f"an integer of more than {MAX_BITS} bits")
    if isinstance(a, _SEQUENCES) and isinstance(b, _SEQUENCES) and _too_long(len(a) + len(b)):
        raise OverflowError(f"sequences joined past {MAX_ITEMS} items")
    return operator.add(a, b)


def bounded_sub(a, b):
    if _big(a) or _big(b):
        raise OverflowError(f"an integer of more than {MAX_BITS} bits")
    return operator.sub(a, b)


def bounded_mod(a, b):
    """``a % b`` on numbers only: ``%`` on a string formats it (``"%0999999999d" % 1``: unbounded)."""
    if isinstance(a, (str, bytes)):
        raise TypeError("% of a string (formatting) is not symbolic arithmetic")
    return operator.mod(a, b)


def bounded_pow(a, b):
    """``a ** b``, refusing (OverflowError) an integer power of more than MAX_BITS bits before computing it."""
    if _big(a) or _big(b):
        raise OverflowError(f"an integer of more than {MAX_BITS} bits")
    if (type(a) is int and type(b) is int and b > 0 and abs(a) > 1
            and (abs(a).bit_length() - 1) * b > MAX_BITS):
        raise OverflowError(f"integer power {a}**{b} has more than {MAX_BITS} bits")
    return operator.pow(a, b)


# op name -> (python function, infix symbol for display or None)
OPS: dict[str, tuple[Any, str | None]] = {
    "add": (_sum, "+"),
    "mul": (_prod, "*"),
    "pow": (bounded_pow, "**"),
    "floordiv": (_floordiv, "//"),
    "ceildiv": (_ceildiv, None),
    "truediv": (operator.truediv, "/"),
    "mod": (bounded_mod, "%"),
    "max": (max, None),
    "min": (min, None),
    "eq": (operator.eq, "=="),
    "ne": (operator.ne, "!="),
    "lt": (operator.lt, "<"),
    "le": (operator.le, "<="),
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "and": (_and, " and "),
    "or": (_or, " or "),
    "not": (operator.not_, None),
}


def _sympy_table():
    import sympy
    from torch.utils._sympy import functions as F

    return [
        (sympy.Add, "add"), (sympy.Mul, "mul"), (sympy.Pow, "pow"), (F.PowByNatural, "pow"),
        (F.FloorDiv, "floordiv"), (F.CeilDiv, "ceildiv"), (F.CleanDiv, "floordiv"),
        (F.IntTrueDiv, "truediv"), (F.Mod, "mod"), (F.PythonMod, "mod"),
        (F.Max, "max"), (F.Min, "min"), (sympy.Max, "max"), (sympy.Min, "min"),
        (sympy.Eq, "eq"), (sympy.Ne, "ne"), (sympy.StrictLessThan, "lt"),
        (sympy.LessThan, "le"), (sympy.StrictGreaterThan, "gt"), (sympy.GreaterThan, "ge"),
        (sympy.And, "and"), (sympy.Or, "or"), (sympy.Not, "not"),
    ]


def encode(expr: Any, rename: Mapping[str, str] | None = None) -> Tree:
    """Encode a sympy expression (or int / SymInt) as a tree; ``rename`` maps symbol names."""
    if isinstance(expr, (bool, int)):
        return expr  # before importing sympy: a graph of static shapes never needs it
    import sympy

    if hasattr(expr, "node") and hasattr(expr.node, "expr"):  # SymInt / SymBool
        expr = expr.node.expr
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return ["truediv", int(expr.p), int(expr.q)]
    if isinstance(expr, sympy.Float):
        return float(expr)
    if isinstance(expr, sympy.Symbol):
        name = rename.get(expr.name, expr.name) if rename else expr.name
        return name
    for cls, op in _sympy_table():
        if isinstance(expr, cls):
            return [op, *(encode(a, rename) for a in expr.args)]
    raise SymExprError(f"unsupported symbolic expression {expr!r} ({type(expr).__name__})")


def symbols(tree: Tree) -> set[str]:
    """The symbol names a tree mentions."""
    if isinstance(tree, str):
        return {tree}
    if isinstance(tree, list):
        return set().union(*(symbols(a) for a in tree[1:])) if len(tree) > 1 else set()
    return set()


def evaluate(tree: Tree, env: Mapping[str, int]) -> Any:
    """Evaluate a tree on plain integers; a malformed tree is a SymExprError, never code.

    The work is bounded: an integer of more than MAX_BITS bits, a division by zero or an operation on
    the wrong operands is a SymExprError too, raised before any large product or power is computed.
    """
    try:
        return _evaluate(tree, env)
    except SymExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:  # ValueError: max() of nothing
        raise SymExprError(f"cannot evaluate {to_str(tree)[:80]}: {type(e).__name__}: {e}") from None


def _evaluate(tree: Tree, env: Mapping[str, int]) -> Any:
    if isinstance(tree, (bool, int, float)):
        return tree
    if isinstance(tree, str):
        try:
            return env[tree]
        except KeyError:
            raise SymExprError(f"unbound symbol {tree!r}") from None
    if isinstance(tree, list) and tree and isinstance(tree[0], str) and tree[0] in OPS:
        value = OPS[tree[0]][0](*(_evaluate(a, env) for a in tree[1:]))
        if type(value) is int and value.bit_length() > MAX_BITS:
            raise OverflowError(f"an integer of more than {MAX_BITS} bits")
        return value
    raise SymExprError(f"malformed expression tree {tree!r:.80}")


def validate(tree: Any) -> int:
    """Check that stored data is a well-formed tree of at most MAX_NODES nodes and MAX_DEPTH levels (used by the
    recipe schema check); its number of nodes. Iterative, and it stops at the bound: a tree that shares
    subtrees in memory (``t = ["mul", t, t]`` 24 times) is refused after MAX_NODES steps, not 2**24."""
    count, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES or depth > MAX_DEPTH:
            raise SymExprError(f"an expression tree of more than {MAX_NODES} nodes or {MAX_DEPTH} levels; "
                               "no guard, size or stride is that large")
        if isinstance(node, (bool, int, float)):
            continue
        if isinstance(node, str):
            if not _SYMBOL.match(node):
                raise SymExprError(f"bad symbol name {node!r:.40}")
            continue
        if not (isinstance(node, list) and node and isinstance(node[0], str) and node[0] in OPS):
            raise SymExprError(f"malformed expression tree {node!r:.80}")
        if len(node) > MAX_NODES:  # before anything is pushed for each operand
            raise SymExprError(f"an expression of {len(node) - 1} operands; at most {MAX_NODES - 1}")
        stack.extend((a, depth + 1) for a in node[1:])
    return count


def to_str(tree: Tree) -> str:
    """Human-readable form, for reports and `hpurecipe show`."""
    if not isinstance(tree, list):
        return str(tree)
    op, args = tree[0], [to_str(a) for a in tree[1:]]
    infix = OPS[op][1]
    if infix and len(args) >= 2:
        return "(" + infix.join(args) + ")" if len(args) > 1 else args[0]
    return f"{op}({', '.join(args)})"
