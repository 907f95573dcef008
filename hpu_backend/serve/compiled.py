"""One compiled graph: per call, pick the shape bucket, make sure its recipe exists, run that recipe.

The hot path is a tuple of symbol values and one dict lookup. A value tuple not seen before is
mapped to its bucket; a bucket not seen before gets its recipe from the store (memory, then disk),
and only then from lowering (the bucket passes over the graph's template). What runs is built from
the recipe's stored bytes — read back from the store on a hit, or from the bytes just written on a
miss — so a stored recipe is the program, never just a report. Buckets whose recipes execute the
same ops share one generated executor. A graph keeps at most as many buckets taken up as the recipe
cache's memory tier holds entries (``CacheConfig.memory_entries``): past that, the least recently
taken one is let go and, if it comes back, taken up again from the store, so a long tail of shapes
cannot grow a process without bound.

Graphs emit their events and report their runs through the session they belong to (``session.py``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

from . import fallback, hbm
from .. import metrics
from ..errors import one_line
from ..formats import symexpr
from .keys import GraphKey, graph_key
from ..lowering import LoweringContext, LoweringError
from ..formats.recipe import Recipe
from ..runtime import RecipeLoadError, build_callable, check_ops, metacheck
from ..runtime.dryrun import build_dry_run
from ..runtime.symbols import symbol_reader
from .session import EVERY_RUN, Event, Session, collect_recipes, emit, listen, listening
from .store import entry_meta
from ..errors import HpuBackendError

__all__ = ["CompiledGraph", "Event", "GuardViolation", "Replay", "Taken", "boxed", "collect_recipes", "emit", "listen"]

log = logging.getLogger(__name__)

# Symbol values remembered per bucket kept: mapping values to a bucket again is cheap, so the memo of
# values seen is simply cleared when it reaches this many per bucket (a long tail of sizes).
_VALUES_PER_BUCKET = 16

class GuardViolation(HpuBackendError, RuntimeError):
    """Symbol values that break the guards a recipe was compiled under (raised per call)."""


@dataclass
class Taken:
    """A bucket's recipe as this process runs it."""

    recipe: Recipe | None  # None: the graph runs eagerly after a lowering failure
    run: Callable[[list], list]
    key: str | None = None
    fallbacks: tuple[str, ...] = ()  # its CPU-fallback ops, counted at every call
    compiled_for: str = ""  # why it was lowered ("" when it came from the store)
    proven: bool = True  # False for a recipe read from the store until it has run once
    outside: bool = False  # read from the store: another process made it, so it is checked before it runs


class CompiledGraph:
    """One AOTAutograd graph (forward, backward or inference) of a Dynamo graph, over all its buckets."""

    def __init__(self, ctx: LoweringContext, template: Recipe, gkey: GraphKey | None, session: Session,
                 first_reason: str = "new graph", eager: Callable[[list], list] | None = None,
                 program: str | None = None):
        # AOTAutograd passes a list of inputs, which run() clears as it goes. An instance attribute,
        # because torch._dynamo.disable's wrapper copies the instance __dict__, not class attributes.
        self._boxed_call = True
        self.ctx = ctx
        self.template = template  # after the graph passes: what every bucket is lowered from
        self.gkey = gkey
        self.session = session  # its store, and the observers of its runs
        self.store = session.store
        self.first_reason = first_reason  # why this graph's first recipe gets compiled
        self.eager = eager  # the boxed aten graph, run after a lowering failure (None: no graph at hand)
        self.policies = ctx.settings.bucket_policies(template.symbols)
        self.read_symbols = symbol_reader(template.symbol_sources)
        self.known: dict[tuple, Taken] = {}  # symbol values -> taken bucket (a memo, cleared when large)
        self.buckets: OrderedDict[tuple, Taken] = OrderedDict()  # bucket -> taken bucket, least recent first
        self.fixed: Taken | None = None  # a graph without symbols, or one that fell back to eager
        self.program = program  # the key of the stored program this graph belongs to (once stored)
        self._executors: OrderedDict[bytes, Callable[[list], list]] = OrderedDict()  # digest of what runs
        self._sound: set[tuple] = set()  # (digest of what runs, input signature) that passed the meta check

    @classmethod
    def build(cls, gm: torch.fx.GraphModule, ctx: LoweringContext, session: Session,
              reason: str = "new graph") -> "CompiledGraph":
        """Lower an aten graph (``ctx.gm``) once and key it; LoweringError if it cannot be lowered."""
        from ..lowering import lower  # a miss only: serving a stored program never imports the pipeline

        lowered = lower(gm, ctx)
        with _phase("key"):
            gkey = _safe_graph_key(lowered.captured, ctx)
        return cls.from_template(ctx.for_bucket({}), lowered.template, gkey, session, reason, eager=boxed(gm))

    @classmethod
    def from_template(cls, ctx: LoweringContext, template: Recipe, gkey: GraphKey | None, session: Session,
                      reason: str = "new graph", eager: Callable | None = None,
                      program: str | None = None) -> "CompiledGraph":
        """A graph from its template (lowered here, or stored in a program); LoweringError if unusable."""
        try:
            check_ops(template)
            graph = cls(ctx, template, gkey, session, reason, eager, program)
        except (RecipeLoadError, ValueError) as e:
            raise LoweringError(str(e), graph=ctx.name) from e
        if not template.symbols:
            graph.fixed = graph.ensure(())
        return graph

    @property
    def symbols(self) -> list[str]:
        return self.template.symbols

    @property
    def capacity(self) -> int:
        """How many buckets (and replays, and executors) this graph keeps taken up: its store's."""
        return self.store.capacity

    def stored_in(self, program: str) -> None:
        """This graph belongs to the stored program under key ``program`` (its events say so from now on)."""
        self.program = program

    def signature(self, args) -> tuple:
        """The symbol values of these inputs (() for a graph without symbols, or running eagerly)."""
        return self.read_symbols(args) if self.fixed is None else ()

    @property
    def recipes(self) -> dict[tuple, Recipe]:
        """bucket -> recipe, for the buckets this process has taken up."""
        return {b: t.recipe for b, t in self.buckets.items() if t.recipe is not None}

    def __call__(self, args: list) -> list:
        _run_on_inner(args)
        taken, values = self.taken_for(args)
        if listening():
            emit(Event("use", self.ctx.name, taken.recipe, True, taken.key, self.program,
                       dict(zip(self.symbols, values)), source=self))
        if taken.fallbacks:  # the bridge counts fallbacks per execution
            fallback.executed(taken.fallbacks)
        observers = self.session.runs
        if not observers and not EVERY_RUN:
            return taken.run(args) if taken.proven else self._first_run(taken, args, values)
        inputs = list(args)  # the executor may clear ``args`` (boxed calling convention)
        out = taken.run(args) if taken.proven else self._first_run(taken, args, values)
        for observe in (*EVERY_RUN, *observers):
            observe(taken.recipe, inputs, out)
        return out

    def _first_run(self, taken: Taken, args: list, values: tuple) -> list:
        """Run a recipe read from the store for the first time. If it fails, the stored entry is a miss:
        it is quarantined (here and in the fleet tier) and the bucket lowered again, stored, and run; if
        the fresh recipe fails too, the failure was the call's own and is raised."""
        kept = list(args)  # run() clears args
        checked = self._checked(taken, args, values)
        if checked is not taken:
            return checked.run(kept)
        try:
            out = taken.run(args)
        except Exception as stored_error:
            return self._recompiled(taken, values, f"failed when run ({one_line(stored_error)})").run(kept)
        taken.proven = True
        return out

    def _checked(self, taken: Taken, args: list, values: tuple) -> Taken:
        """``taken``, once its stored recipe has run on meta tensors shaped as ``args`` and made what it declares
        (``runtime.metacheck``; once per input signature); a freshly lowered bucket if it did not."""
        if not (taken.outside and self.ctx.settings.execute):
            return taken
        sound = (_executable(taken.recipe), metacheck.signature(args))
        if sound in self._sound:
            return taken
        try:
            with _phase("check"), unset_fake_temporarily():
                metacheck.check_call(taken.recipe, args)
        except RecipeLoadError as e:
            return self._recompiled(taken, values, f"does not fit this call: {e}")
        if len(self._sound) >= _VALUES_PER_BUCKET * self.store.capacity:
            self._sound.clear()
        self._sound.add(sound)
        return taken

    def _recompiled(self, taken: Taken, values: tuple, why: str) -> Taken:
        """A stored recipe that cannot serve is a miss: quarantined (here and in the fleet tier), and its bucket
        lowered again and stored; the fresh recipe takes its place."""
        log.warning("hpu_backend: %s: stored recipe %s %s; quarantined, compiling instead", self.ctx.name,
                    taken.key, why)
        self.store.discard(taken.key)
        bucket = self.bucket_of(values) if self.fixed is not taken else ()
        fresh = self._compile({s: list(b) for s, b in zip(self.symbols, bucket)})
        self._replace(taken, fresh, bucket)
        return fresh

    def _replace(self, old: Taken, new: Taken, bucket: tuple) -> None:
        new.fallbacks = old.fallbacks
        if self.fixed is old:
            self.fixed = new
        if bucket in self.buckets:
            self.buckets[bucket] = new
        self.known = {v: new if t is old else t for v, t in self.known.items()}
        self._executors.pop(_executable(old.recipe), None)

    def taken_for(self, args: list) -> tuple[Taken, tuple]:
        """The bucket these inputs run, and their symbol values."""
        if self.fixed is not None:
            return self.fixed, ()
        values = self.read_symbols(args)
        taken = self.known.get(values)
        if taken is None:
            taken = self.on_new_values(values)
            if taken.outside and taken.proven:  # it ran at other sizes: these are checked before they run
                taken = self._checked(taken, args, values)
        return taken, values

    def bucket_of(self, values: tuple) -> tuple:
        bucket = []
        for sym, policy, v in zip(self.symbols, self.policies, values):
            if policy.overflows(v):
                log.warning("hpu_backend: %s: shape %s=%d is above the largest bucket (%d) and was not "
                            "warmed; compiling an exact recipe for it", self.ctx.name, sym, v, policy.limit)
            bucket.append(policy.bucket(v))
        return tuple(bucket)

    def on_new_values(self, values: tuple) -> Taken:
        env = dict(zip(self.symbols, values))
        self._check_guards(env)
        taken = self.session.graph_step(self.ctx.name, lambda: self.ensure(self.bucket_of(values)),
                                        None if self.eager is None else self._eager_from_now)
        if taken.recipe is None:  # it runs eagerly from now on
            return taken
        if len(self.known) >= _VALUES_PER_BUCKET * self.store.capacity:
            self.known.clear()
        self.known[values] = taken
        return taken

    def _eager_from_now(self) -> Taken:
        """Every later call runs the graph eagerly (after a bucket that could not be lowered)."""
        self.fixed = Taken(None, self.eager)
        return self.fixed

    def _check_guards(self, env: dict[str, int]) -> None:
        """GuardViolation if these values break a guard the recipes were compiled under. A guard that cannot be
        evaluated (a stored template's, e.g. a huge power) makes the stored program unusable: it is quarantined,
        so that no later run fails on it too, and LoweringError raised (the graph then runs eagerly)."""
        for g in self.template.guards:
            try:
                holds = symexpr.evaluate(g, env)
            except (symexpr.SymExprError, ArithmeticError, TypeError, ValueError) as e:
                if self.program is not None:
                    self.store.discard(self.program)
                raise LoweringError(f"the guard {symexpr.to_str(g):.80} cannot be evaluated ({one_line(e)}); its "
                                    "stored program is quarantined", graph=self.ctx.name) from None
            if not holds:
                raise GuardViolation(f"{self.ctx.name}: values {env} break the guard {symexpr.to_str(g)} "
                                     "its recipes were compiled under")

    def ensure(self, bucket: tuple) -> Taken:
        """The bucket's recipe and executor: from this graph, the store, or lowering (in that order)."""
        taken = self.buckets.get(bucket)
        if taken is not None:
            self.buckets.move_to_end(bucket)
            return taken
        named = {s: list(b) for s, b in zip(self.symbols, bucket)}
        taken, hit, missed = self._from_store(named)
        if taken is None:
            taken = self._compile(named)
        fallback_ops = fallback.report(taken.recipe, strict=self.ctx.settings.strict)  # strict check, log lines
        if self.ctx.settings.execute:  # a compile-only run executes no op on the CPU, and plans past HBM freely
            taken.fallbacks = fallback_ops
            hbm.check(taken.recipe, strict=self.ctx.settings.strict)
        self.buckets[bucket] = taken
        emit(Event("take", self.ctx.name, taken.recipe, hit, taken.key, self.program,
                   compiled_for=taken.compiled_for, source=self, missed=missed))
        self._let_go_past_capacity()
        return taken

    def _let_go_past_capacity(self) -> None:
        """Let go of the least recently taken buckets past the store's capacity (and of their symbol values)."""
        while len(self.buckets) > self.store.capacity:
            _, dropped = self.buckets.popitem(last=False)
            self.known = {values: t for values, t in self.known.items() if t is not dropped}

    def _from_store(self, bucket: dict[str, list[int]]) -> tuple[Taken | None, bool, tuple[str, ...]]:
        """(taken, hit, why it missed: what differs from the same graph's entry under another key, if any)."""
        if self.gkey is None:
            return None, False, ()
        key, parts, detail = self.gkey.for_bucket(bucket)
        with _phase("load"):
            found = self.store.load(key, self._executor)
        metrics.record_cache(self.ctx.name, hit=found is not None)
        if found is None:
            return None, False, self.store.why_missed("recipe", parts, detail, self.ctx.name)
        return Taken(*found, key, proven=False, outside=True), True, ()

    def _compile(self, bucket: dict[str, list[int]]) -> Taken:
        reason = self.first_reason if not self.buckets else "new bucket"
        recipe = self.compile_bucket(bucket, reason)
        key = meta = None
        if self.gkey is not None:
            key, parts, detail = self.gkey.for_bucket(bucket)
            meta = entry_meta(recipe, parts, detail, self.ctx.settings)
        recipe = self.store.put(key, recipe, meta)
        try:
            return Taken(recipe, self._executor(recipe), key, compiled_for=reason)
        except RecipeLoadError as e:
            raise LoweringError(str(e), graph=self.ctx.name) from e

    def _executor(self, recipe: Recipe) -> Callable[[list], list]:
        """The callable for a recipe, shared with earlier buckets whose recipes run the same ops."""
        if set(recipe.writes) - set(self.template.writes):  # a stored bucket writes what its graph does not
            raise RecipeLoadError(f"recipe {recipe.name!r:.60} writes {sorted(recipe.writes)!r:.80}; its graph "
                                  f"writes only {sorted(self.template.writes)!r:.80}")
        digest = _executable(recipe)
        run = self._executors.get(digest)
        if run is not None:
            self._executors.move_to_end(digest)
            return run
        with _phase("executor"), unset_fake_temporarily():  # constants must be real tensors
            run = build_callable(recipe) if self.ctx.settings.execute else build_dry_run(recipe)
        self._executors[digest] = run
        if len(self._executors) > self.store.capacity:
            self._executors.popitem(last=False)  # buckets still using it keep it alive
        return run

    def key_of(self, recipe: Recipe) -> str | None:
        """The cache key this graph used for one of its recipes (None if the cache was bypassed)."""
        taken = self.buckets.get(tuple(tuple(recipe.bucket[s]) for s in self.symbols))
        return None if taken is None else taken.key

    def compile_bucket(self, bucket: dict[str, list[int]], reason: str) -> Recipe:
        start = time.perf_counter()
        recipe = next(self.session.recipes(self.template, self.ctx, [bucket]))
        seconds = time.perf_counter() - start
        metrics.record_phase("lowering", seconds)
        recipe.facts["compile_time_s"] = seconds
        metrics.record_compilation(seconds, reason)
        log.debug("compiled %s bucket %s in %.1f ms (%s)", self.ctx.name, bucket, seconds * 1e3, reason)
        return recipe


def _run_on_inner(args: list) -> None:
    """A recipe runs on plain tensors. A wrapper tensor with one inner tensor (torch's traceable-subclass protocol:
    the simulated device's) can still arrive as an input where a trace took it for a plain one: a tensor an
    earlier graph made on the device (position ids, a causal mask) saved for the backward. It is replaced by its
    inner tensor, read through the protocol (which lets the device finish pending work first), so the recipe's
    ops never go back through the device (whose lazy mode would hand them a value not computed yet)."""
    for i, a in enumerate(args):
        if type(a) is not torch.Tensor and _wrapper_type(type(a)):
            inner, _ = a.__tensor_flatten__()
            if len(inner) == 1:
                args[i] = getattr(a, inner[0])


# asked once per type (parameters and sizes are most arguments)
_wrapper_type = functools.cache(is_traceable_wrapper_subclass_type)


def boxed(fn: Callable) -> Callable[[list], list]:
    """``fn(*args)`` as a boxed call (it takes the argument list and clears it), like AOTAutograd's."""
    def run(args: list):
        out = fn(*args)
        args.clear()
        return out

    run._boxed_call = True
    return run


def _executable(recipe: Recipe) -> bytes:
    """A digest of what the generated executor depends on (not placement, plan or estimates); a digest, so
    that the table of executors holds no copy of recipe content."""
    parts = (recipe.input_names, recipe.symbol_sources, recipe.symbols,
             [(n.name, n.op, n.args, n.kwargs, n.out) for n in recipe.nodes], recipe.outputs,
             {k: (c.dtype, c.shape, c.data) for k, c in recipe.constants.items()})
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


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


class Replay:
    """``mode="reduce-overhead"``, HPU Graphs under torch.compile: an inference graph captured per input
    signature and replayed. A capture takes the signature's bucket once and gives it static buffers for the
    inputs that are not parameters or buffers; a replay copies the call's inputs into those buffers and runs
    the bucket's executor directly: no symbol reading, no AOTAutograd runtime wrapper."""

    def __init__(self, graph: CompiledGraph, example_inputs: list, unreplayed: Callable[..., list]):
        self.graph = graph
        self.unreplayed = unreplayed  # the graph's ordinary call: what runs a bucket that cannot be lowered
        self.copied = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and not _static(x)]
        self.captured: dict[tuple, tuple[Taken, list[tuple[int, torch.Tensor]]]] = {}

    def __call__(self, *args) -> list:
        signature = self.graph.signature(args)
        found = self.captured.get(signature)
        if found is None:
            return self._capture(signature, args)
        taken, buffers = found
        full = list(args)
        for i, buffer in buffers:
            buffer.copy_(args[i])
            full[i] = buffer
        if taken.fallbacks:
            fallback.executed(taken.fallbacks)
        if torch.is_grad_enabled():  # an inference graph runs without autograd, as AOTAutograd runs it
            with torch.no_grad():
                return taken.run(full)
        return taken.run(full)

    def _capture(self, signature: tuple, args: tuple) -> list:
        try:
            with torch.no_grad():
                outs = self.graph(list(args))  # takes up the bucket (store or lowering), emits its events
        except LoweringError:
            return self.unreplayed(*args)  # runs eagerly after one warning (or raises, in strict mode)
        taken, _ = self.graph.taken_for(list(args))
        if taken.recipe is not None:  # a bucket that fell back to eager is not captured
            if len(self.captured) >= self.graph.capacity:  # bounded like the graph's buckets
                self.captured.pop(next(iter(self.captured)))
            self.captured[signature] = (taken, [(i, static_buffer(args[i])) for i in self.copied])
        return outs


def static_buffer(like: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor with ``like``'s shape, strides, dtype and device: where a replay copies an input."""
    return torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device=like.device)


def _static(x: torch.Tensor) -> bool:
    """A parameter or a buffer Dynamo marked static: bound for the graph's lifetime, never copied."""
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None
