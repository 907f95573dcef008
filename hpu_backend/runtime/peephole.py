"""Exact rewrites of the op sequence before code generation, to spend less time per call on the host.

``t(w)`` read only by ``addmm(b, x, t(w))`` becomes ``linear(x, w, b)``: one dispatcher call instead
of two, and the same kernel (ATen's CPU ``linear`` with a 1-D bias is that very ``addmm``), so the
results are bit-identical. Likewise ``view(x, [M, K])`` → ``addmm`` → ``view(·, [..., N])`` over a
contiguous N-d ``x`` becomes ``linear(x, w, b)``: ATen's linear flattens such an input into that same
addmm (``_flatten_nd_linear``), in C++ rather than as three calls from Python. And ``v = copy(a, src)``
read only by a later ``copy_(a, v)`` becomes ``copy_(a, src)``: the functional ``copy`` of a view returns a
copy of the view's whole storage (a slice of DeepSpeed's 2 GB gradient bucket copies 2 GB), and both write
``src``'s values into ``a``. Only the executor's code changes; the recipe and its key do not.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..formats.recipe import Node, Recipe, iter_refs
from .writes import writes_anything

TRANSPOSES = ("aten::t.default", "aten::permute.default")
RESHAPES = ("aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default")


def fold_linear(recipe: Recipe, keep: set[str] = frozenset()) -> list[Node]:
    """The recipe's nodes with each foldable transpose + addmm pair replaced by one linear node
    (except transposes of the values in ``keep``: those the executor takes once at build time)."""
    readers = Counter(iter_refs([[n.args, list(n.kwargs.values())] for n in recipe.nodes] + [recipe.outputs]))
    by_name = {n.name: n for n in recipe.nodes}
    specs = dict(zip(recipe.input_names, recipe.inputs))
    specs.update({n.name: n.out[0] for n in recipe.nodes if len(n.out) == 1})
    folded: dict[str, str] = {}  # transpose node -> the addmm that absorbs it
    for node in recipe.nodes:
        t = _foldable_transpose(node, by_name, specs, readers)
        if t is not None and not (isinstance(t.args[0], dict) and t.args[0].get("r") in keep):
            folded[t.name] = node.name
    out = []
    for node in recipe.nodes:
        if node.name in folded:
            continue
        if node.name in folded.values():
            bias, x, t_ref = node.args
            node = dataclasses.replace(node, op="aten::linear.default",
                                       args=[x, by_name[t_ref["r"]].args[0], bias])
        out.append(node)
    return _fold_copy_back(_fold_nd_linear(out, specs, readers), readers)


def _fold_copy_back(nodes: list[Node], readers: Counter) -> list[Node]:
    """``v = copy(a, src) … copy_(a, v)`` as ``copy_(a, src)`` when nothing in between writes anything and
    nothing else reads ``v`` (see the module docstring)."""
    pending: dict[str, Node] = {}  # copy nodes read once, by name, since the last write
    drop, replace = set(), {}
    for node in nodes:
        copied = _ref_node(node.args[1] if len(node.args) == 2 else None, pending)
        if node.op == "aten::copy_.default" and not node.kwargs and copied is not None \
                and copied.args[0] == node.args[0]:
            drop.add(copied.name)
            replace[node.name] = dataclasses.replace(node, args=[node.args[0], copied.args[1], *copied.args[2:]])
        if writes_anything(node):
            pending.clear()
        elif node.op == "aten::copy.default" and 2 <= len(node.args) <= 3 and not node.kwargs \
                and readers[node.name] == 1:
            pending[node.name] = node
    return [replace.get(n.name, n) for n in nodes if n.name not in drop]


def _fold_nd_linear(nodes: list[Node], specs: dict, readers: Counter) -> list[Node]:
    """``view → linear → view`` over a contiguous N-d input, as one N-d linear (see the module docstring)."""
    by_name = {n.name: n for n in nodes}
    drop, replace = set(), {}
    for out_view in nodes:
        inner = _ref_node(out_view.args[0] if out_view.args else None, by_name)
        if out_view.op not in RESHAPES or inner is None or readers[inner.name] != 1:
            continue
        linear = _linear_args(inner, by_name, specs, readers)
        if linear is None:
            continue
        in_view = _ref_node(linear[0], by_name)
        if in_view is None or in_view.op not in RESHAPES or readers[in_view.name] != 1:
            continue
        x = in_view.args[0]
        spec = specs.get(x.get("r")) if isinstance(x, dict) else None
        if spec is None or not _contiguous(spec) or len(spec.shape) < 3 or len(out_view.out) != 1:
            continue
        if out_view.out[0].shape != [*spec.shape[:-1], out_view.out[0].shape[-1]]:
            continue
        drop.update((in_view.name, inner.name, *linear[3:]))
        replace[out_view.name] = dataclasses.replace(out_view, op="aten::linear.default", args=[x, *linear[1:3]])
    return [replace.get(n.name, n) for n in nodes if n.name not in drop]


def _linear_args(node: Node, by_name: dict[str, Node], specs: dict, readers: Counter) -> list | None:
    """``[x, w, b]`` (and the transpose node it absorbs) if ``node`` is a linear or an addmm of a transpose."""
    if node.op == "aten::linear.default" and len(node.args) == 3 and not node.kwargs:
        return list(node.args)
    t = _foldable_transpose(node, by_name, specs, readers)
    return None if t is None else [node.args[1], t.args[0], node.args[0], t.name]


def _ref_node(arg, by_name: dict[str, Node]) -> Node | None:
    return by_name.get(arg["r"]) if isinstance(arg, dict) and "r" in arg else None


def _contiguous(spec) -> bool:
    """A tensor whose recorded (concrete) strides are the contiguous ones for its shape."""
    if spec.kind != "tensor" or not all(type(d) is int for d in [*spec.shape, *spec.stride]):
        return False
    expected, step = [], 1
    for d in reversed(spec.shape):
        expected.append(step)
        step *= max(d, 1)
    return [st for d, st in zip(spec.shape, spec.stride) if d != 1] == \
        [st for d, st in zip(spec.shape, reversed(expected)) if d != 1]


def _foldable_transpose(node: Node, by_name: dict[str, Node], specs: dict, readers: Counter) -> Node | None:
    if node.op != "aten::addmm.default" or node.kwargs or len(node.args) != 3:
        return None
    bias, _, mat2 = node.args
    t = _ref_node(mat2, by_name)
    if t is None or t.op not in TRANSPOSES or readers[t.name] != 1:
        return None
    if t.op == "aten::permute.default" and t.args[1:] != [[1, 0]]:
        return None
    # A 1-D bias is the only kind ATen's linear hands to addmm unchanged.
    spec = specs.get(bias["r"]) if isinstance(bias, dict) and "r" in bias else None
    return t if spec is not None and spec.kind == "tensor" and len(spec.shape) == 1 else None
