"""The lowering pipeline: aten FX graph → Recipe, as ordered lists of named passes read top to bottom.

``lower`` is the one entry for every way a graph arrives (torch.compile's AOTAutograd graphs, torch.export
for packages and HPU graphs, the meta-device trace of capacity planning): ``capture_graph`` turns the FX
graph into recipe data (what the recipe key hashes), then the graph passes run once per graph
(placement, clusters, fusions, dtype policy) on that symbolic recipe. ``lower_bucket`` runs the bucket
passes (specialize, memory plan, cost) for one shape bucket on the result, without touching the FX graph
again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import metrics
from ..formats.recipe import Recipe
from .context import LoweringContext
from .errors import LoweringError
from .passes.apply_dtype_policy import apply_dtype_policy
from .passes.capture import capture
from .passes.estimate_cost import estimate_cost
from .passes.find_transfers import find_transfers
from .passes.fuse_attention import fuse_attention
from .passes.fuse_tpc import fuse_tpc
from .passes.partition import partition
from .passes.place import place
from .passes.plan_memory import plan_memory
from .passes.size_transfers import size_transfers
from .passes.specialize import specialize

log = logging.getLogger(__name__)

# Passes over the symbolic recipe, once per graph; each returns the (new) recipe. ``ctx.gm`` holds
# the FX graph for passes that use torch.fx tooling (node names match recipe node names).
GRAPH_PASSES: list[Callable[[Recipe, LoweringContext], Recipe]] = [
    place,  # HPU engine or CPU fallback per node (op table, PT_HPU_PLACE_ON_CPU, strict)
    partition,  # HPU nodes into clusters; fallbacks split them
    find_transfers,  # values crossing the host link
    fuse_attention,  # FusedSDPA groups (sdpa ops and hand-written attention)
    fuse_tpc,  # TPC elementwise chains and reduction pro/epilogues
    apply_dtype_policy,  # storage dtypes the plan assumes (Settings.dtype_policy: native | fp8)
]

# Passes over the recipe for one bucket; each returns the (new) recipe.
BUCKET_PASSES: list[Callable[[Recipe, LoweringContext], Recipe]] = [
    specialize,  # bind to the bucket; plan at its upper end (facts["plan_at"])
    size_transfers,  # bytes over the host link
    plan_memory,  # liveness, buffer offsets, persistent vs arena bytes, peak
    estimate_cost,  # roofline per cluster + CPU fallback + transfers (an estimate)
]


@dataclass(frozen=True)
class Lowered:
    """A graph lowered once: what the key hashes, and what every bucket is lowered from."""

    captured: Recipe  # the graph as data, before any pass
    template: Recipe  # after the graph passes, still symbolic


def lower(gm: torch.fx.GraphModule, ctx: LoweringContext) -> Lowered:
    """Capture ``gm`` and run the graph passes: the one way into lowering (LoweringError if it cannot)."""
    start = time.perf_counter()
    captured = capture_graph(gm, ctx)
    captured_at = time.perf_counter()
    metrics.record_phase("capture", captured_at - start)
    template = lower_graph(captured, ctx)
    metrics.record_phase("lowering", time.perf_counter() - captured_at)
    return Lowered(captured, template)


def capture_graph(gm: torch.fx.GraphModule, ctx: LoweringContext) -> Recipe:
    """The aten graph as recipe data, symbolic, with no pass applied."""
    return _run(capture, [], ctx, gm, ctx)


def lower_graph(captured: Recipe, ctx: LoweringContext) -> Recipe:
    """Run the graph passes: the symbolic recipe every bucket of this graph starts from."""
    return _run_all(GRAPH_PASSES, ["capture"], captured, ctx)


def lower_bucket(template: Recipe, ctx: LoweringContext) -> Recipe:
    """Run the bucket passes for ``ctx.bucket`` on a symbolic recipe from ``lower_graph``."""
    return _run_all(BUCKET_PASSES, ["capture", *(p.__name__ for p in GRAPH_PASSES)], template, ctx)


def _run_all(passes, done: list[str], recipe: Recipe, ctx: LoweringContext) -> Recipe:
    # Passes work on plain data (and may use real tensors as vectors); the tracer's fake mode,
    # active while AOTAutograd calls the compilers, must not intercept them.
    with unset_fake_temporarily():
        for p in passes:
            recipe = _run(p, done, ctx, recipe, ctx)
    return recipe


def _run(p, done: list[str], ctx: LoweringContext, *args):
    name = p.__name__
    try:
        out = p(*args)
    except LoweringError as e:
        if not e.pass_name:
            e = LoweringError(e.reason, node=e.node, pass_name=name, passes_before=done, graph=ctx.name)
        raise e from e.__cause__
    except Exception as e:  # any bug in a pass becomes a LoweringError naming the pass
        raise LoweringError(f"{type(e).__name__}: {e}", pass_name=name, passes_before=done,
                            graph=ctx.name) from e
    done.append(name)
    log.debug("lowering %s: pass %s done", ctx.name, name)
    return out
