"""Exact rewrites of the op sequence before code generation, to spend less time per call on the host.

``t(w)`` read only by ``addmm(b, x, t(w))`` becomes ``linear(x, w, b)``: one dispatcher call instead
of two, and the same kernel (ATen's CPU ``linear`` with a 1-D bias is that very ``addmm``), so the
results are bit-identical. Only the executor's code changes; the recipe and its key do not.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..recipe import Node, Recipe, iter_refs

TRANSPOSES = ("aten::t.default", "aten::permute.default")


def fold_linear(recipe: Recipe) -> list[Node]:
    """The recipe's nodes with each foldable transpose + addmm pair replaced by one linear node."""
    readers = Counter(iter_refs([[n.args, list(n.kwargs.values())] for n in recipe.nodes] + [recipe.outputs]))
    by_name = {n.name: n for n in recipe.nodes}
    specs = dict(zip(recipe.input_names, recipe.inputs))
    specs.update({n.name: n.out[0] for n in recipe.nodes if len(n.out) == 1})
    folded: dict[str, str] = {}  # transpose node -> the addmm that absorbs it
    for node in recipe.nodes:
        t = _foldable_transpose(node, by_name, specs, readers)
        if t is not None:
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
    return out


def _foldable_transpose(node: Node, by_name: dict[str, Node], specs: dict, readers: Counter) -> Node | None:
    if node.op != "aten::addmm.default" or node.kwargs or len(node.args) != 3:
        return None
    bias, _, mat2 = node.args
    t = by_name.get(mat2["r"]) if isinstance(mat2, dict) and "r" in mat2 else None
    if t is None or t.op not in TRANSPOSES or readers[t.name] != 1:
        return None
    if t.op == "aten::permute.default" and t.args[1:] != [[1, 0]]:
        return None
    # A 1-D bias is the only kind ATen's linear hands to addmm unchanged.
    spec = specs.get(bias["r"]) if isinstance(bias, dict) and "r" in bias else None
    return t if spec is not None and spec.kind == "tensor" and len(spec.shape) == 1 else None
