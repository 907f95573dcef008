"""Gaudi's lazy mode: an eager-style script runs graph by graph, each graph a recipe, with a per-step report.

On the hpu device (``setup.enable("lazy")``) the device's ops accumulate into a graph (``capture/lazy.py``);
on host tensors ``with hpu_backend.gaudi.lazy():`` does the same for a block. A graph is cut at ``mark_step()``
or where the host needs a value. Each cut graph is keyed by its structure (its ops, their arguments and the
inputs' dtypes, shapes and strides: ``serve.keys.program_key``, with no Dynamo in it), and a structure seen
before runs its recipe at once; a new one is lowered by the same passes as a Dynamo graph
(``CompiledGraph.build``), its recipe taken from the recipe cache or compiled and stored there, and run by
the recipe executor.

What ran is written in the device context's one step ledger (``Ledger``): per step (from one ``mark_step()``
to the next) the ops issued, the estimated device time of the recipes that ran, the graphs that ran, the
recipes compiled, why each new graph is new (compared with the graphs run before: the op or argument that
changed, with its source line), and every host sync with the user's source line. ``LazyEngine`` is the
context's lazy mode: its recorder, its runner and whether a block or the device records.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.fx

from ..capture.lazy import LazyRecorder, Pending
from ..lowering import LoweringContext
from ..serve.compiled import CompiledGraph, boxed, collect_recipes
from ..serve.keys import Unkeyable, program_key
from ..serve.session import session_for
from ..settings import Settings

log = logging.getLogger(__name__)

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
    """What ran between two ``mark_step()`` calls: ops issued on the device, the estimated device seconds of the
    recipes that ran, the lazy graphs and the host syncs."""

    index: int
    ops: int = 0
    estimated_device_s: float = 0.0
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


class Ledger:
    """The device context's steps, oldest first (the latest ``KEPT_STEPS``): the one record of what each step
    did, which the lazy report, the device report and the run report all read."""

    def __init__(self):
        self.steps: list[Step] = [Step(0)]
        self.ops_at_start = 0  # the device's op count when the step under way began
        self.total_s = 0.0  # estimated device seconds over the whole run

    @property
    def step(self) -> Step:
        return self.steps[-1]

    def add_device_time(self, seconds: float) -> None:
        self.steps[-1].estimated_device_s += seconds
        self.total_s += seconds

    def on_run(self, recipe) -> None:
        """A recipe ran: its estimated device time is the step's."""
        self.add_device_time(float(recipe.facts.get("cost", {}).get("total_s") or 0.0))

    def end_step(self, ops_now: int) -> None:
        """The step ends (``mark_step()``, the end of a lazy block); the next one begins. A step in which
        nothing happened is not kept."""
        step = self.steps[-1]
        step.ops = ops_now - self.ops_at_start
        self.ops_at_start = ops_now
        if step.ops or step.estimated_device_s or step.graphs or step.syncs:
            self.steps.append(Step(step.index + 1))
            del self.steps[:-KEPT_STEPS]

    def lazy_report(self) -> LazyReport:
        """The steps that ran lazy graphs or synced."""
        return LazyReport(s for s in self.steps if s.graphs or s.syncs)


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

    def __init__(self, settings: Settings, ledger: Ledger | None = None, names: Iterator[int] | None = None):
        self.settings = settings
        self.session = session_for(settings)
        # structure -> (graph, summary)
        self.graphs: OrderedDict[str, tuple[CompiledGraph | _Eager, list]] = OrderedDict()
        # the structure as recorded (``Pending.key``) -> the same entry: a graph run before is found without
        # building its GraphModule or its program key
        self.recorded: OrderedDict[tuple, CompiledGraph | _Eager] = OrderedDict()
        self.ledger = ledger or Ledger()  # where the graphs run and the syncs are written
        self.names = names or itertools.count()  # numbers the graphs: lazy_graph_0000, ...

    def __call__(self, pending: Pending) -> list[torch.Tensor]:
        return self.prepare(pending)(list(pending.inputs))

    def prepare(self, pending: Pending) -> CompiledGraph | _Eager:
        """The graph that runs ``pending`` (compiled if its structure is new), written in the step's ledger as run."""
        graph, compiled, new = self._graph_for(pending)
        self.ledger.step.graphs.append(GraphRun(graph.ctx.name, pending.ops, pending.reason, pending.source,
                                                _key(graph), compiled, new))
        return graph

    def _graph_for(self, pending: Pending) -> tuple[CompiledGraph | _Eager, int, str]:
        """The graph for this structure, with the recipes compiled for it now and why it is new ("": seen)."""
        found = self.recorded.get(pending.key) if pending.key is not None else None
        if found is not None:
            self.recorded.move_to_end(pending.key)
            return found, 0, ""
        graph, compiled, new = self._keyed_graph_for(pending)
        if pending.key is not None:
            self.recorded[pending.key] = graph
            if len(self.recorded) > self.session.store.capacity:
                self.recorded.popitem(last=False)
        return graph, compiled, new

    def _keyed_graph_for(self, pending: Pending) -> tuple[CompiledGraph | _Eager, int, str]:
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
        run as it is after one warning (an error in strict mode): the session's one policy (``graph_step``)."""
        name = f"lazy_graph_{next(self.names):04d}"
        ctx = LoweringContext(settings=self.settings, name=name, kind="lazy", gm=pending.gm)

        def lowered():
            with collect_recipes() as taken:
                graph = CompiledGraph.build(pending.gm, ctx, self.session, "new graph")
            return (graph, _summary(pending.gm)), sum(not hit for _, _, hit in taken)

        def eager():
            return (_Eager(ctx, boxed(pending.gm)), _summary(pending.gm)), 0

        return self.session.graph_step(name, lowered, eager)

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
        return (f"new ops ({len(summary)} nodes); the closest graph seen, {name}, differs: "
                f"{_difference(closest, summary)}")

    def sync(self, what: str, source: str, cut: bool) -> None:
        self.ledger.step.syncs.append(Sync(what, source, cut))


def _key(graph: CompiledGraph | _Eager) -> str | None:
    """A graph's recipe cache key (None for a graph run as it is)."""
    return graph.fixed.key if isinstance(graph, CompiledGraph) and graph.fixed else None


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


class LazyEngine:
    """A device context's lazy mode: the recorder, the runner, and whether a ``lazy()`` block (host tensors) or
    the device (its own ops) records into them. ``end_step`` is the caller's: the context ends the ledger's step."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.runner: LazyRunner | None = None
        self.recorder: LazyRecorder | None = None
        self.names = itertools.count()
        self.depth = 0  # nested lazy() blocks
        self.device = False  # the hpu device records its ops into the recorder (not pushed as a mode)

    def _start(self, settings: Settings) -> None:
        if self.runner is None or settings != self.runner.settings:
            self.runner = LazyRunner(settings, self.ledger, self.names)
            self.recorder = LazyRecorder(self.runner, self.runner.sync, self.runner.recorded.__contains__)

    def for_device(self, settings: Settings) -> LazyRecorder:
        """The recorder the hpu device hands its ops to (on the device, lazy mode records the device's ops only,
        as on Gaudi)."""
        if self.depth:
            raise RuntimeError("the hpu device cannot start inside a hpu_backend.gaudi.lazy() block")
        self._start(settings)
        self.device = True
        return self.recorder

    def release_device(self) -> bool:
        """The device left lazy mode: run what it left pending (True when the step is to end)."""
        if not self.device:
            return False
        self.device = False
        self.recorder.flush("end of lazy mode")
        return True

    def enter(self, options: dict | None = None) -> None:
        """A ``lazy()`` block begins (blocks nest; the outer block's settings hold)."""
        if self.depth == 0:
            settings = Settings.from_options(options) if options is not None else None
            if self.runner is None or settings is not None:
                self._start(settings or Settings.from_options({}))
            self.recorder.host.__enter__()
            self.recorder.__enter__()
        self.depth += 1

    def exit(self) -> bool:
        """A ``lazy()`` block ends; the outermost runs what is pending (True: the step is to end)."""
        self.depth -= 1
        if self.depth:
            return False
        self.recorder.__exit__(None, None, None)  # pop the recorder first: the flush records nothing
        try:
            self.recorder.flush("end of lazy mode")
        finally:
            self.recorder.host.__exit__(None, None, None)
        return True

    def flush_step(self) -> bool:
        """``mark_step()``: run the pending graph when lazy mode is on (True: it was)."""
        if self.depth or self.device:
            self.recorder.flush("mark_step")
            return True
        return False
