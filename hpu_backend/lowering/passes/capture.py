"""Capture: the aten FX graph (with the facts earlier passes left in ``node.meta['hpu']``) → Recipe.

Annotations that change a recipe (FusedSDPA's recompute choice, from ``node.meta["custom"]``) are
recorded per node in ``facts["annotations"]``, which the recipe key hashes. The nodes an
``F.scaled_dot_product_attention`` call decomposed into (its math path: torch takes it on the host for
dropout in training, among others) are listed in ``facts["sdpa_calls"]``: on Gaudi that call is one
FusedSDPA kernel, so fusion must not mistake its softmax and matmuls for attention written by hand.

Shape symbols are renamed ``s0, s1, ...`` in order of first appearance among the inputs, so the
same graph captured in another process (or with other Dynamo symbol names) gives the same recipe.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ...formats import symexpr
from ...formats.recipe import Constant, Node, Recipe, ValueSpec
from ...runtime import collectives, ops
from ...runtime.writes import written_inputs
from ..buffers import FUSED_SDPA_ANNOTATION
from ..context import LoweringContext
from ..errors import LoweringError

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def capture(gm: torch.fx.GraphModule, ctx: LoweringContext) -> Recipe:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    rename, sources = symbol_table([n.meta.get("val") for n in placeholders])
    cap = _Capture(gm, rename)
    recipe = Recipe(
        name=ctx.name, kind=ctx.kind, target=ctx.settings.target,
        inputs=[cap.spec_one(n) for n in placeholders],
        input_names=[n.name for n in placeholders],
        nodes=[], outputs=[],
        symbols=list(rename.values()), symbol_sources=sources,
    )
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            recipe.constants[node.name] = cap.constant(node)
        elif node.op == "call_function":
            recipe.nodes.append(cap.node(node))
        elif node.op == "output":
            recipe.outputs = [cap.arg(a, node) for a in node.args[0]]
        elif node.op != "placeholder":
            raise LoweringError(f"unsupported FX node kind {node.op!r}", node=node)
    recipe.guards = encode_guards(ctx.guards, rename)
    recipe.writes = sorted(written_inputs(recipe))  # the declaration the runtime checks the ops against
    annotations = {n.name: a for n in gm.graph.nodes if (a := recorded_annotations(n))}
    if annotations:
        recipe.facts["annotations"] = annotations
    sdpa = [n.name for n in gm.graph.nodes if n.op == "call_function" and from_sdpa_call(n)]
    if sdpa:
        recipe.facts["sdpa_calls"] = sdpa
    groups = {n.name: g for n in gm.graph.nodes if (g := collective_group(n, ctx))}
    if groups:
        recipe.facts["collectives"] = groups
    labels = {n.name: label for n in placeholders if (label := _user_label(n, ctx.input_labels))}
    if labels:  # for reading only: not in the recipe key (two models' identical graphs share a recipe)
        recipe.facts["input_labels"] = labels
    return recipe


def _user_label(node: torch.fx.Node, labels: tuple[str, ...]) -> str | None:
    """The user's name of an AOTAutograd input that is one of the Dynamo graph's inputs (a primal), or None."""
    idx = getattr(node.meta.get("desc"), "idx", None)
    if type(node.meta.get("desc")).__name__ != "PlainAOTInput" or not isinstance(idx, int):
        return None
    return labels[idx] if 0 <= idx < len(labels) else None


def collective_group(node: torch.fx.Node, ctx: LoweringContext) -> dict:
    """A collective's kind, group name and group size (what its cost needs); {} for any other node.

    The size is the one the op states (all_gather, reduce_scatter), else the context's (capacity planning),
    else that of the process group of this process with that name; LoweringError if none is known."""
    op = ops.op_name(node.target) if node.op == "call_function" else None
    if op is None or (kind := collectives.kind(op)) is None:
        return {}
    name = collectives.group_name(node, op)
    size = collectives.stated_size(node, op) or ctx.groups.get(name) or collectives.live_group_size(name)
    if not isinstance(size, int) or size < 1:
        raise LoweringError(f"collective {kind} over group {name!r:.40}: not a process group of this process",
                            node=node)
    return {"kind": kind, "group": str(name), "group_size": size}


def recorded_annotations(node: torch.fx.Node) -> dict:
    """The user's annotations on a node that change its recipe, as plain data (FusedSDPA's recompute choice).

    ``torch.fx.traceback.annotate`` puts them in ``node.meta["custom"]``; Dynamo and AOTAutograd carry
    them to the forward and backward nodes made from the annotated call. Other annotations are ignored.
    """
    note = (node.meta.get("custom") or {}).get(FUSED_SDPA_ANNOTATION)
    if not isinstance(note, dict):
        return {}
    return {FUSED_SDPA_ANNOTATION: {"recompute": bool(note.get("recompute"))}}


def from_sdpa_call(node: torch.fx.Node) -> bool:
    """Whether Dynamo traced ``node`` from an ``F.scaled_dot_product_attention`` call (a backward node: from
    the forward's). Dynamo records the torch function a node came from; AOTAutograd carries it over."""
    stack = node.meta.get("source_fn_stack") or node.meta.get("fwd_source_fn_stack") or []
    return bool(stack) and getattr(stack[-1][1], "__name__", "") == "scaled_dot_product_attention"


def symbol_table(values: list) -> tuple[dict[str, str], list[list[int]]]:
    """Rename the free symbols of input values (fake tensors, SymInts) ``s0, s1, ...`` by first
    appearance; record where each can be read at run time (``[input index, dim]``, -1: a SymInt)."""
    rename: dict[str, str] = {}
    sources: dict[str, list[int]] = {}
    for i, val in enumerate(values):
        dims = [(-1, val)] if isinstance(val, torch.SymInt) else (
            list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else [])
        for d, size in dims:
            expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
            for sym in sorted(expr.free_symbols, key=lambda s: s.name):
                rename.setdefault(sym.name, f"s{len(rename)}")
            if isinstance(expr, sympy.Symbol) and expr.name not in sources:
                sources[expr.name] = [i, d]
    missing = [s for s in rename if s not in sources]
    if missing:
        raise LoweringError(f"shape symbols {missing} are not readable from any input")
    return rename, [sources[s] for s in rename]


def encode_guards(guards, rename) -> list:
    """The guards (sympy) that mention only the symbols in ``rename``, encoded, deduplicated, in stable order."""
    out = []
    for g in guards:
        names = {s.name for s in getattr(g, "free_symbols", ())}
        if names and names <= set(rename):
            try:
                tree = symexpr.encode(g, rename)
            except symexpr.SymExprError:
                continue  # a guard we cannot encode is still enforced by Dynamo itself
            if tree not in out:
                out.append(tree)
    return sorted(out, key=repr)


class _Capture:
    def __init__(self, gm: torch.fx.GraphModule, rename: dict[str, str]):
        self.gm = gm
        self.rename = rename

    def dim(self, size: Any) -> Any:
        return symexpr.encode(size, self.rename)

    def spec_one(self, node: torch.fx.Node) -> ValueSpec:
        specs = self.specs(node.meta.get("val"), node)
        return specs[0] if len(specs) == 1 else ValueSpec(kind="other")

    def specs(self, val: Any, node) -> list[ValueSpec]:
        if isinstance(val, (tuple, list)):
            return [s for v in val for s in self.specs(v, node)] or [ValueSpec(kind="none")]
        if isinstance(val, torch.Tensor):
            return [ValueSpec(
                kind="tensor", dtype=str(val.dtype).removeprefix("torch."),
                shape=[self.dim(s) for s in val.shape],
                stride=[self.dim(s) for s in val.stride()] if val.layout == torch.strided else [],
                device=val.device.type)]
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            try:
                return [ValueSpec(kind="sym", expr=symexpr.encode(val, self.rename))]
            except symexpr.SymExprError:
                return [ValueSpec(kind="sym")]
        if val is None:
            return [ValueSpec(kind="none")]
        if isinstance(val, (int, float, bool)):
            return [ValueSpec(kind="scalar", expr=val)]
        return [ValueSpec(kind="other")]

    def node(self, node: torch.fx.Node) -> Node:
        name = ops.op_name(node.target)
        if name is None:
            raise LoweringError(f"call target {node.target} has no recipe op name", node=node)
        facts = node.meta.get("hpu", {})
        return Node(
            name=node.name, op=name,
            args=[self.arg(a, node) for a in node.args],
            kwargs={k: self.arg(v, node) for k, v in node.kwargs.items()},
            out=self.specs(node.meta.get("val"), node),
            placement=facts.get("placement", "hpu"), engine=facts.get("engine", ""),
            cluster=facts.get("cluster", -1), fusion=facts.get("fusion", -1),
            source=_source_line(node),
        )

    def arg(self, a: Any, node) -> Any:
        if isinstance(a, torch.fx.Node):
            return {"r": a.name}
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        if isinstance(a, (list, tuple)):
            return [self.arg(x, node) for x in a]
        if isinstance(a, torch.dtype):
            return {"dtype": str(a).removeprefix("torch.")}
        if isinstance(a, torch.device):
            return {"device": str(a)}
        if isinstance(a, torch.layout):
            return {"layout": str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).removeprefix("torch.")}
        if isinstance(a, torch._ops.OpOverload):
            return {"op": ops.op_name(a)}
        if isinstance(a, complex):
            return {"complex": [a.real, a.imag]}
        raise LoweringError(f"unsupported argument {a!r:.60} of type {type(a).__name__}", node=node)

    def constant(self, node: torch.fx.Node) -> Constant:
        value = getattr(self.gm, node.target, None)
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            raise LoweringError(f"get_attr {node.target!r} is not a dense tensor constant", node=node)
        return constant_of(value)


def constant_of(value: torch.Tensor) -> Constant:
    """A dense tensor's bytes as recipe data."""
    with unset_fake_temporarily():  # compilers may run under the tracing fake mode
        t = value.detach().contiguous().cpu()
        start = t.storage_offset() * t.element_size()
        data = bytes(t.untyped_storage())[start:start + t.numel() * t.element_size()]
    return Constant(dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape), data=data)


def _source_line(node: torch.fx.Node) -> str:
    found = _FILE_LINE.findall(node.meta.get("stack_trace") or "")
    return f"{portable_path(found[-1][0])}:{found[-1][1]}" if found else ""


def portable_path(path: str) -> str:
    """A source file as the recipe stores it: relative to the working directory when under it, else to the
    ``sys.path`` entry that holds it (``transformers/models/gpt2/modeling_gpt2.py``), else as given. The same
    model built from two checkouts or two virtualenvs gives byte-identical recipes."""
    roots = [r for r in (os.getcwd(), *sys.path) if os.path.isabs(r) and r.rstrip(os.sep)
             and path.startswith(r.rstrip(os.sep) + os.sep)]
    return os.path.relpath(path, max(roots, key=len)) if os.path.isabs(path) and roots else path
