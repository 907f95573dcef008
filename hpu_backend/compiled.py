"""One compiled graph: per call, pick the shape bucket, make sure its recipe exists, run the executor.

The hot path is a tuple of symbol values and one dict lookup. A value tuple not seen before is
mapped to its bucket; a bucket not seen before gets its recipe from the process's recipe table,
then the disk cache, and only then from lowering (graph passes at most once per graph, bucket
passes once per bucket). The executor is generated once per graph from the captured recipe: its
code is symbolic, so it serves every bucket.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from typing import Callable

import torch
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import fallback, metrics, symexpr
from .buckets import Policy, policies_for
from .keys import GraphKey, graph_key
from .lowering import LoweringContext, LoweringError, capture_graph, lower_bucket, lower_graph
from .recipe import Recipe
from .runtime import RecipeLoadError, build_callable
from .runtime.dryrun import build_dry_run
from .runtime.symbols import symbol_reader
from .store import RecipeStore, store_for

log = logging.getLogger(__name__)


_collectors: list[list] = []


@contextlib.contextmanager
def collect_recipes():
    """Collect ``(compiled_graph, recipe, hit)`` for every recipe a graph takes up in this block."""
    found: list = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


_live: "weakref.WeakSet[CompiledGraph]" = weakref.WeakSet()


def live_graphs() -> list["CompiledGraph"]:
    """Every compiled graph alive in this process (warm-up watches them to see which recipes a call uses)."""
    return list(_live)


class GuardViolation(RuntimeError):
    """Symbol values that break the guards a recipe was compiled under (raised per call)."""


class CompiledGraph:

    def __init__(self, ctx: LoweringContext, captured: Recipe, run: Callable[[list], list],
                 policies: list[Policy], gkey: GraphKey | None, store: RecipeStore,
                 first_reason: str = "new graph"):
        # AOTAutograd passes a list of inputs, which run() clears as it goes. An instance attribute,
        # because torch._dynamo.disable's wrapper copies the instance __dict__, not class attributes.
        self._boxed_call = True
        self.ctx = ctx
        self.first_reason = first_reason  # why this graph's first recipe gets compiled
        self.captured = captured
        self.run = run
        self.policies = policies
        self.gkey = gkey
        self.store = store
        self.template: Recipe | None = None  # graph passes' result, made on the first miss
        self.read_symbols = symbol_reader(captured.symbol_sources)
        self.known: dict[tuple, tuple] = {}  # symbol values -> bucket
        self.recipes: dict[tuple, Recipe] = {}  # bucket -> recipe
        self.keys: dict[tuple, str] = {}  # bucket -> recipe key (for warm-up manifests)
        _live.add(self)

    @classmethod
    def build(cls, gm: torch.fx.GraphModule, ctx: LoweringContext, reason: str = "new graph") -> "CompiledGraph":
        ctx.gm = gm
        with _phase("capture"):
            captured = capture_graph(gm, ctx)
        try:
            with _phase("executor"), unset_fake_temporarily():  # constants must be real tensors
                run = build_callable(captured) if ctx.settings.execute else build_dry_run(captured)
            policies = policies_for(ctx.settings.buckets, captured.symbols)
        except (RecipeLoadError, ValueError) as e:
            raise LoweringError(str(e), graph=ctx.name) from e
        with _phase("key"):
            gkey = _safe_graph_key(captured, ctx)
        graph = cls(ctx, captured, run, policies, gkey, store_for(ctx.settings), reason)
        if not captured.symbols:
            graph.ensure(())
        return graph

    def __call__(self, args: list) -> list:
        if self.read_symbols is not None:
            values = self.read_symbols(args)
            if values not in self.known:
                self.on_new_values(values)
        return self.run(args)

    def bucket_of(self, values: tuple) -> tuple:
        bucket = []
        for sym, policy, v in zip(self.captured.symbols, self.policies, values):
            if policy.overflows(v):
                log.warning("hpu_backend: %s: shape %s=%d is above the largest bucket (%d) and was not "
                            "warmed; compiling an exact recipe for it", self.ctx.name, sym, v, policy.limit)
            bucket.append(policy.bucket(v))
        return tuple(bucket)

    def on_new_values(self, values: tuple) -> None:
        env = dict(zip(self.captured.symbols, values))
        for g in self.captured.guards:
            if not symexpr.evaluate(g, env):
                raise GuardViolation(f"{self.ctx.name}: values {env} break the guard {symexpr.to_str(g)} "
                                     "its recipes were compiled under")
        bucket = self.bucket_of(values)
        try:
            self.ensure(bucket)
        except LoweringError as e:
            if self.ctx.settings.strict or self.ctx.gm is None:
                raise
            log.warning("hpu_backend: could not lower %s, running it eagerly: %s", self.ctx.name, e.reason)
            self.run, self.read_symbols = make_boxed_func(self.ctx.gm), None
            return
        self.known[values] = bucket

    def ensure(self, bucket: tuple) -> Recipe:
        """The recipe for ``bucket``: from this graph, the store, or lowering (in that order)."""
        recipe = self.recipes.get(bucket)
        if recipe is not None:
            return recipe
        named = {s: list(b) for s, b in zip(self.captured.symbols, bucket)}
        key = parts = detail = None
        hit = False
        if self.gkey is not None:
            key, parts, detail = self.gkey.for_bucket(named)
            with _phase("cache_get"):
                recipe = self.store.get(key)
            hit = recipe is not None
            metrics.record_cache(self.ctx.name, hit=hit)
        if recipe is None:
            recipe = self.compile_bucket(named, reason=self.first_reason if not self.recipes else "new bucket")
            if key is not None:
                self.store.put(key, recipe, parts, detail, self.ctx.settings)
        fallback.report(recipe, strict=self.ctx.settings.strict)  # lines, counts, cpu_fallback metric
        self.recipes[bucket] = recipe
        if key is not None:
            self.keys[bucket] = key
        for found in _collectors:
            found.append((self, recipe, hit))
        return recipe

    def key_of(self, recipe: Recipe) -> str | None:
        """The cache key this graph used for one of its recipes (None if the cache was bypassed)."""
        return self.keys.get(tuple(tuple(recipe.bucket[s]) for s in self.captured.symbols))

    def compile_bucket(self, bucket: dict[str, list[int]], reason: str) -> Recipe:
        start = time.perf_counter()
        self.ctx.bucket = bucket
        if self.template is None:
            self.template = lower_graph(self.captured, self.ctx)
        recipe = lower_bucket(self.template, self.ctx)
        seconds = time.perf_counter() - start
        metrics.record_phase("lowering", seconds)
        recipe.facts["compile_time_s"] = seconds
        metrics.record_compilation(seconds, reason)
        log.debug("compiled %s bucket %s in %.1f ms (%s)", self.ctx.name, bucket, seconds * 1e3, reason)
        return recipe


@contextlib.contextmanager
def _phase(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.record_phase(name, time.perf_counter() - start)


def _safe_graph_key(captured: Recipe, ctx: LoweringContext) -> GraphKey | None:
    """Key parts, or None (cache bypassed, with the reason logged) if they cannot be computed."""
    try:
        return graph_key(captured, ctx.settings)
    except (TypeError, ValueError, KeyError) as e:
        log.info("hpu_backend: %s bypasses the recipe cache: cannot compute its key (%s)", ctx.name, e)
        return None

