"""Helpers for the lowering tests: trace a small function to an aten graph and lower it pass by pass."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from hpu_backend.capture.decompositions import hpu_decompositions
from hpu_backend.lowering import BUCKET_PASSES, GRAPH_PASSES, LoweringContext, capture_graph, lower_bucket, lower_graph
from hpu_backend.settings import Settings


def context(fn, *args, symbolic: bool = False, **options) -> tuple:
    """(captured recipe, context) for ``fn`` traced on ``args`` with the HPU decompositions."""
    mode = "symbolic" if symbolic else "fake"

    def boxed(*a):  # AOTAutograd graphs return a tuple; so do these
        out = fn(*a)
        return out if isinstance(out, tuple) else (out,)

    gm = make_fx(boxed, decomposition_table=hpu_decompositions(), tracing_mode=mode)(*args)
    settings = Settings.from_options({"cache": False, **options}, env={})
    ctx = LoweringContext(settings=settings, name="test_graph", kind="inference", gm=gm)
    return capture_graph(gm, ctx), ctx


def lower(fn, *args, symbolic: bool = False, bucket: dict | None = None, **options):
    """The recipe after every graph pass and, if ``bucket`` (or no symbols), every bucket pass."""
    captured, ctx = context(fn, *args, symbolic=symbolic, **options)
    template = lower_graph(captured, ctx)
    if bucket is None and captured.symbols:
        return template
    return lower_bucket(template, ctx.at(bucket or {}))


def run_graph_passes_until(name: str, fn, *args, **options):
    """The recipe after the graph passes up to and including ``name``."""
    recipe, ctx = context(fn, *args, **options)
    for p in GRAPH_PASSES:
        recipe = p(recipe, ctx)
        if p.__name__ == name:
            return recipe
    raise KeyError(name)


def ops(recipe) -> list[str]:
    return [n.op for n in recipe.nodes]


def node(recipe, op_fragment: str):
    return next(n for n in recipe.nodes if op_fragment in n.op)


__all__ = ["context", "lower", "run_graph_passes_until", "ops", "node", "BUCKET_PASSES", "torch"]
