"""Gaudi's lazy mode: an eager-style script runs graph by graph, each graph a recipe, with a per-step report.

``PT_HPU_LAZY_MODE=1`` (read once, when ``hpu_backend.gaudi`` is imported) turns it on for the whole
process, as importing ``habana_frameworks.torch.core`` does on Gaudi; ``with hpu_backend.gaudi.lazy():``
turns it on for a block. Ops accumulate into a graph (``capture/lazy.py``) that is cut at ``mark_step()``
or where the host needs a value. Each cut graph is keyed by its structure (its ops, their arguments and
the inputs' dtypes, shapes and strides: ``serve.keys.program_key``, with no Dynamo in it), and a structure
seen before in this process runs its recipe at once; a new one is lowered by the same passes as a Dynamo
graph (``CompiledGraph.build``), its recipe taken from the recipe cache or compiled and stored there, and
run by the recipe executor.

``lazy_report()`` gives, per step (from one ``mark_step()`` to the next), the graphs that ran, the recipes
compiled, why each new graph is new (compared with the graph at the same place in the step before: the
op or argument that changed, with its source line), and every host sync with the user's source line.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx

from ..capture.lazy import LazyRecorder, Pending
from ..lowering import LoweringContext, LoweringError
from ..serve.compiled import CompiledGraph, boxed, collect_recipes
from ..serve.keys import Unkeyable, program_key
from ..serve.session import session_for
from ..settings import Settings

log = logging.getLogger(__name__)

ENV_VAR = "PT_HPU_LAZY_MODE"
KEPT_STEPS = 10_000  # the report keeps the latest steps of a long run


@dataclass(frozen=True)
class Sync:
    """A host read of a tensor value: ``cut`` when it ended a pending graph."""

    what: str  # "Tensor.item", "Tensor.__format__", "aten.nonzero.default (...)"
    source: str  # the user's line: "train.py:41"
    cut: bool


@dataclass(frozen=True)
class GraphRun:
    """One lazy graph executed."""

    name: str  # the graph's name in the recipe cache: "lazy_graph_0003"
    ops: int
    cut_by: str  # "mark_step" or what cut it mid-step
    source: str  # the user's line that cut it
    key: str | None  # its recipe's cache key
    compiled: int  # recipes compiled for it (0: run from memory or the disk cache)
    new: str = ""  # why this graph was not one seen before ("" when it was)


@dataclass
class Step:
    """What ran between two ``mark_step()`` calls that ended graphs."""

    index: int
    graphs: list[GraphRun] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)

    @property
    def compiled(self) -> int:
        return sum(g.compiled for g in self.graphs)

    def summary(self) -> str:
        lines = [f"step {self.index}: {len(self.graphs)} graph(s), {self.compiled} recipe(s) compiled, "
                 f"{len(self.syncs)} host sync(s)"]
        lines += [f"  graph {g.name} ({g.ops} ops, cut by {g.cut_by} at {g.source}): "
                  + (f"new: {g.new}" if g.new else "seen before") for g in self.graphs]
        lines += [f"  sync {s.what} at {s.source}" + (" (cut the graph)" if s.cut else "") for s in self.syncs]
        return "\n".join(lines)


class LazyReport(list):
    """The steps of a lazy-mode run, oldest first (the latest ``KEPT_STEPS``; ``str()`` prints them)."""

    def __str__(self) -> str:
        return "\n".join(s.summary() for s in self)


_names = itertools.count()


@dataclass(frozen=True)
class _Eager:
    """A lazy graph that could not be lowered: its FX graph, run as it is."""

    ctx: LoweringContext
    run: Callable[[list], list]

    def __call__(self, args: list) -> list:
        return self.run(args)


class LazyRunner:
    """Runs cut graphs: structure → compiled graph (this process), else lowered and its recipe taken from the store
    of the session the graphs are handed to."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.session = session_for(settings)
        self.graphs: OrderedDict[str, tuple[CompiledGraph | _Eager, list]] = OrderedDict()  # structure -> graph, summary
        self.steps = LazyReport([Step(0)])

    def __call__(self, pending: Pending) -> list[torch.Tensor]:
        graph, compiled, new = self._graph_for(pending)
        key = graph.fixed.key if isinstance(graph, CompiledGraph) and graph.fixed else None
        self.steps[-1].graphs.append(GraphRun(graph.ctx.name, pending.ops, pending.reason, pending.source, key,
                                              compiled, new))
        return graph(list(pending.inputs))

    def _graph_for(self, pending: Pending) -> tuple[CompiledGraph | _Eager, int, str]:
        """The graph for this structure, with the recipes compiled for it now and why it is new ("": seen)."""
        try:
            structure = program_key(pending.gm, pending.inputs, self.settings).key
        except Unkeyable as e:
            log.info("hpu_backend: a lazy graph has no structural key (%s); it is lowered each time", e)
            structure = None
        found = self.graphs.get(structure) if structure else None
        if found is not None:
            self.graphs.move_to_end(structure)
            return found[0], 0, ""
        new = self._why_new(pending.gm)
        found, compiled = self._build(pending)
        if structure:
            self.graphs[structure] = found
            if len(self.graphs) > self.session.store.capacity:
                self.graphs.popitem(last=False)
        return found[0], compiled, new

    def _build(self, pending: Pending) -> tuple[tuple[CompiledGraph | _Eager, list], int]:
        """The graph lowered (its recipe from the store, or compiled), or after a lowering failure its FX graph,
        run as it is after one warning (an error in strict mode), as the backend does for Dynamo graphs."""
        name = f"lazy_graph_{next(_names):04d}"
        ctx = LoweringContext(settings=self.settings, name=name, kind="lazy", gm=pending.gm)
        try:
            with collect_recipes() as taken:
                graph = CompiledGraph.build(pending.gm, ctx, self.session, "new graph")
        except LoweringError as e:
            if self.settings.strict:
                raise
            log.warning("hpu_backend: could not lower %s, running it eagerly: %s", name, e.reason)
            return (_Eager(ctx, boxed(pending.gm)), _summary(pending.gm)), 0
        return (graph, _summary(pending.gm)), sum(not hit for _, _, hit in taken)

    def _why_new(self, gm: torch.fx.GraphModule) -> str:
        """The closest graph this process has run, and the first difference from it."""
        summary = _summary(gm)
        known = [(g.ctx.name, k) for g, k in self.graphs.values()]
        if not known:
            return "the first graph"
        name, closest = max(known, key=lambda nk: _likeness(nk[1], summary))
        same_ops, _ = _likeness(closest, summary)
        if same_ops:  # the same ops: a constant, an argument or an input layout changed
            return f"like {name} but {_difference(closest, summary)}"
        return f"new ops ({len(summary)} nodes); the closest graph seen, {name}, differs: {_difference(closest, summary)}"

    def sync(self, what: str, source: str, cut: bool) -> None:
        self.steps[-1].syncs.append(Sync(what, source, cut))

    def end_step(self) -> None:
        step = self.steps[-1]
        if step.graphs or step.syncs:
            self.steps.append(Step(step.index + 1))
            del self.steps[:-KEPT_STEPS]


def _summary(gm: torch.fx.GraphModule) -> list:
    """The graph as (what, arguments, source line) per node, node references by position."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return f"%{index[a]}"
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        return a

    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            val = n.meta["val"]
            out.append(("input", [str(val.dtype).removeprefix("torch."), list(val.shape)], ""))
        elif n.op == "output":
            out.append(("output", [arg(a) for a in n.args[0]], ""))
        elif n.op == "call_function":
            out.append((str(n.target), [arg(a) for a in n.args] + [(k, arg(v)) for k, v in n.kwargs.items()],
                        n.meta.get("source", "")))
    return out


def _likeness(known: list, summary: list) -> tuple:
    """Same ops in the same order first, then the longest identical prefix."""
    prefix = next((i for i, (a, b) in enumerate(zip(known, summary)) if a != b), min(len(known), len(summary)))
    return [a[0] for a in known] == [b[0] for b in summary], prefix


def _difference(before: list, after: list) -> str:
    """What changed between two graph summaries, in words: the first node that differs."""
    for i, (a, b) in enumerate(zip(before, after)):
        if a[0] != b[0]:
            return f"node {i} is {b[0]} where it had {a[0]}" + (f" at {b[2]}" if b[2] else "")
        if a[1] != b[1]:
            if a[0] == "input":
                return f"input {i} changed from {a[1][0]}{a[1][1]} to {b[1][0]}{b[1][1]}"
            changed = [(j, x, y) for j, (x, y) in enumerate(zip(a[1], b[1])) if x != y]
            j, x, y = changed[0] if changed else (len(a[1]), a[1], b[1])
            if isinstance(x, tuple) and isinstance(y, tuple):  # a keyword argument
                (j, x), (_, y) = x, y
            kind = "a constant changed" if _scalar(x) and _scalar(y) else "an argument changed"
            return f"{kind}: {b[0]} argument {j}: {x!r} -> {y!r}" + (f" at {b[2]}" if b[2] else "")
    if len(before) != len(after):
        return f"it has {len(after)} nodes where that one had {len(before)}"
    return "same ops and arguments, other global state (grad mode, autocast) or input properties"


def _scalar(v) -> bool:
    return isinstance(v, (int, float, bool)) or isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)


class _Lazy:
    """The process's lazy mode: the recorder, the runner and whether the modes are on."""

    def __init__(self):
        self.runner: LazyRunner | None = None
        self.recorder: LazyRecorder | None = None
        self.depth = 0
        self.from_env = False  # PT_HPU_LAZY_MODE=1 entered the process-wide mode
        self.device = False  # the hpu device records its ops into the recorder (not pushed as a mode)

    def for_device(self, settings: Settings) -> LazyRecorder:
        """The recorder the hpu device hands its ops to. The process-wide mode of PT_HPU_LAZY_MODE=1 steps
        aside: on the device, lazy mode records the device's ops only, as on Gaudi."""
        if self.from_env:
            self.from_env = False
            self.exit()
        if self.depth:
            raise RuntimeError("the hpu device cannot start inside a hpu_backend.gaudi.lazy() block")
        if self.runner is None or settings != self.runner.settings:
            self.runner = LazyRunner(settings)
            self.recorder = LazyRecorder(self.runner, self.runner.sync)
        self.device = True
        return self.recorder

    def enter(self, options: dict | None = None) -> None:
        if self.depth == 0:
            settings = Settings.from_options(options) if options is not None else None
            if self.runner is None or settings is not None and settings != self.runner.settings:
                self.runner = LazyRunner(settings or Settings.from_options({}))
                self.recorder = LazyRecorder(self.runner, self.runner.sync)
            self.recorder.host.__enter__()
            self.recorder.__enter__()
        self.depth += 1

    def exit(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.recorder.__exit__(None, None, None)  # pop the recorder first: the flush records nothing
            try:
                self.recorder.flush("end of lazy mode")
                self.runner.end_step()
            finally:
                self.recorder.host.__exit__(None, None, None)

    def mark_step(self) -> None:
        for fn in _STEP_STARTS:
            fn()
        if self.depth or self.device:
            self.recorder.flush("mark_step")
            self.runner.end_step()
        for fn in _STEP_OBSERVERS:
            fn()


_state = _Lazy()
_STEP_OBSERVERS: list[Callable[[], None]] = []
_STEP_STARTS: list[Callable[[], None]] = []


def observe_steps(fn: Callable[[], None]) -> None:
    """Call ``fn()`` after every ``mark_step()``, in or out of lazy mode (once per fn): the device's step report."""
    if fn not in _STEP_OBSERVERS:
        _STEP_OBSERVERS.append(fn)


def observe_step_starts(fn: Callable[[], None]) -> None:
    """Call ``fn()`` as every ``mark_step()`` begins (once per fn): the device's timeline stops the user's clock."""
    if fn not in _STEP_STARTS:
        _STEP_STARTS.append(fn)


@contextlib.contextmanager
def lazy(options: dict | None = None):
    """Lazy mode for this block (this thread): ops accumulate into graphs cut at ``mark_step()`` and host reads.

    ``options`` are backend options (``target``, ``cache``, ...) for the graphs of this block; without them,
    the environment's, read once. Nested blocks share the outer block's."""
    _state.enter(options)
    try:
        yield
    finally:
        _state.exit()


def is_lazy() -> bool:
    return _state.depth > 0


def mark_step() -> None:
    """End the pending lazy graph: run it, and start the next step of the report (nothing outside lazy mode)."""
    _state.mark_step()


def device_recorder(settings: Settings) -> LazyRecorder:
    """The lazy recorder of the hpu device (``hpu_backend.device``): ``mark_step()`` cuts its graphs too, and
    ``lazy_report()`` reports them."""
    return _state.for_device(settings)


def release_device_recorder() -> None:
    """The hpu device left lazy mode: run what it left pending; ``mark_step()`` no longer cuts its graphs."""
    if _state.device:
        _state.device = False
        _state.recorder.flush("end of lazy mode")
        _state.runner.end_step()


def lazy_report() -> LazyReport:
    """The steps of this process's lazy-mode run so far (empty if lazy mode never ran)."""
    return LazyReport() if _state.runner is None else LazyReport(
        [s for s in _state.runner.steps if s.graphs or s.syncs])


def _from_env() -> None:
    """``PT_HPU_LAZY_MODE=1``: lazy mode for the whole process, from now on (read once, at import)."""
    value = os.environ.get(ENV_VAR, "0").strip()
    if value not in ("0", "1", ""):
        log.warning("hpu_backend: %s=%r is not 0 or 1; lazy mode stays off", ENV_VAR, value)
    elif value == "1":
        _state.enter()
        _state.from_env = True


_from_env()
