"""Apply the dtype policy: the storage dtypes the plan and estimate assume (``Settings.dtype_policy``).

``native`` keeps every value as traced. ``fp8`` stores in fp8 (1 byte) every value a matrix op (MME:
matmuls, attention) reads — weights, the activations fed to matmuls, and keys/values, traced back through
views and copies (cat, clone) to where they are made or come in, so that a KV cache is fp8 — and MME ops
run at the fp8 peak (the cost model takes an op's dtype from its first input). Everything else stays as
traced. The policy is a setting, so it is part of every recipe key; the simulated device cannot execute an
fp8 plan, so Settings accepts ``fp8`` only for plans that do not execute (prebuild, capacity planning).
"""

from __future__ import annotations

import copy

from ...formats.recipe import Recipe
from ..buffers import alias_roots
from ..context import LoweringContext
from ..optable import shared_table
from ..values import node_refs

FP8 = "float8_e4m3fn"
_WIDE = ("bfloat16", "float16", "float32")


def apply_dtype_policy(recipe: Recipe, ctx: LoweringContext) -> Recipe:
    return as_fp8(recipe) if ctx.settings.dtype_policy == "fp8" else recipe


def as_fp8(recipe: Recipe) -> Recipe:
    """A copy of ``recipe`` with the values MME ops read (and what they are views or copies of) in fp8."""
    out = copy.deepcopy(recipe)
    specs = dict(zip(out.input_names, out.inputs))
    nodes = out.node_map()
    table, roots = shared_table(), alias_roots(out)
    seen: set[str] = set()
    stack = [r for n in out.nodes if n.engine == "mme" for r in node_refs(n)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = nodes.get(name)
        for spec in [specs[name]] if name in specs else (node.out if node else []):
            if spec.kind == "tensor" and spec.dtype in _WIDE:
                spec.dtype = FP8
        if node is not None and _passes_through(node, table):
            stack.extend(node_refs(node))
        root = roots.get((name, 0))
        if root is not None and root[0] != name:
            stack.append(root[0])
    return out


def _passes_through(node, table) -> bool:
    """Views and copies (cat, clone, expand...) keep their input's bytes: fp8 in, fp8 out."""
    record = table.lookup(node.op)
    return node.engine == "view" or (record is not None and record.kind == "layout")
