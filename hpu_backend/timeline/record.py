"""What a run records for its timeline: the user's Python time between device calls (measured, the simulator's
own time left out), and each op, launch, copy, sync and step end as a plain tuple (``model.py``).

The device calls ``enter()`` when a call of the user's reaches it and ``leave()`` when it hands control back:
the time between a ``leave()`` and the next ``enter()`` is the user's Python. The clock is injected (tests use
one that stands still, so the host's time is the bridge's constants alone).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Callable

from .model import cost_of

KEPT_EVENTS = 2_000_000  # past it, the run goes on and the timeline says it was cut
_COSTS = 10_000  # recipes whose Cost is remembered

# The kind of launch under way, for recipes run inside an HPU-graph replay (set by the replay).
_KIND: contextvars.ContextVar[str | None] = contextvars.ContextVar("hpu_backend_launch_kind", default=None)


@contextlib.contextmanager
def launching(kind: str):
    """Recipes run in this block are launched as ``kind`` (``"replay"``: an HPU graph)."""
    token = _KIND.set(kind)
    try:
        yield
    finally:
        _KIND.reset(token)


class Recorder:
    """The events of one process's run."""

    def __init__(self, mode: str, clock: Callable[[], float] = time.perf_counter):
        self.mode = mode  # "lazy" | "eager": the host cost of one op
        self.clock = clock
        self.events: list[tuple] = []
        self.truncated = False
        self.depth = 0  # nested calls into the simulator
        self.left_at = clock()
        self.paused_at, self.paused = self.left_at, False
        self.simulator_s = 0.0  # the simulator's own time in the step under way (measured, not a Gaudi's)
        self.ids: dict = {}  # (recipe name, bucket) -> recipe id
        self.costs: dict = {}  # id(recipe) -> (recipe, Cost): the recipe is kept so its id is never reused
        self.last: tuple | None = None  # the last launch's (name, rid, Cost), for eager ops run again
        self.loader_seen = False  # a copy of this step came from a DataLoader

    def add(self, event: tuple) -> None:
        if len(self.events) < KEPT_EVENTS:
            self.events.append(event)
        else:
            self.truncated = True

    def pause(self) -> None:
        """The simulator's own work starts: the Python time since the user last had control is the user's."""
        if not self.paused:
            now = self.clock()
            self.add(("py", max(now - self.left_at, 0.0)))
            self.paused_at, self.paused = now, True

    def resume(self) -> None:
        """Control goes back to the user's Python."""
        self.left_at, self.paused = self.clock(), False
        self.simulator_s += self.left_at - self.paused_at

    def enter(self) -> None:
        """A call of the user's reached the simulator (calls may nest)."""
        if self.depth == 0:
            self.pause()
        self.depth += 1

    def leave(self) -> None:
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0:
            self.resume()

    def op(self) -> None:
        self.add(("op", self.mode))

    def launch(self, recipe, kind: str | None = None) -> None:
        """A recipe ran: enqueued as ``kind`` (the replay's, else the caller's), its cost from its facts; its first
        launch carries the time the simulator spent since the user's call reached it (lowering it). Outside a
        device call (a compiled graph run by the user), the simulator's time ends here."""
        outside = self.depth == 0
        if outside:
            self.pause()
        self._launch(recipe, kind)
        if outside:
            self.resume()

    def _launch(self, recipe, kind: str | None) -> None:
        found = self.costs.get(id(recipe))
        if found is None:
            key = (recipe.name, tuple(sorted((k, tuple(v)) for k, v in recipe.bucket.items())))
            rid = self.ids.setdefault(key, len(self.ids) + 1)
            found = (recipe, cost_of(recipe.facts), rid)
            if len(self.costs) < _COSTS:
                self.costs[id(recipe)] = found
            compile_s = max(self.clock() - self.paused_at, 0.0)
        else:
            compile_s = 0.0
        _, cost, rid = found
        self.last = (recipe.name, rid, cost)
        self.add(("launch", _KIND.get() or kind or "compiled", recipe.name, rid, cost, compile_s))

    def again(self, last: tuple) -> None:
        """An eager op whose one-op recipe ran before runs again (the device skips the recipe machinery)."""
        name, rid, cost = last
        self.add(("launch", "eager", name, rid, cost, 0.0))

    def copy(self, nbytes: int, to_device: bool, pinned: bool, non_blocking: bool, source: str,
             from_loader: Callable[[], bool] = lambda: False) -> None:
        """A copy; ``from_loader()`` says whether the step's input comes from a DataLoader (asked once a step)."""
        if to_device and not self.loader_seen and from_loader():
            self.loader_seen = True
            self.add(("loader",))
        self.add(("copy", int(nbytes), to_device, pinned, non_blocking, source))

    def comm(self, kind: str, nbytes: int, group: int) -> None:
        """A collective the host issued on device tensors (DDP's gradient all-reduces, outside every recipe)."""
        self.add(("comm", kind, int(nbytes), int(group)))

    def sync(self, what: str, source: str) -> None:
        self.add(("sync", what, source))

    def step_end(self) -> None:
        """``mark_step()`` ended (its start called ``enter()``): the step boundary with the host's clock and the
        simulator's own time in the step (both measured), and the user's clock again."""
        now = self.clock()
        self.add(("step", self.simulator_s + (now - self.paused_at if self.paused else 0.0), now))
        self.simulator_s = 0.0
        self.loader_seen = False
        if self.paused:
            self.paused_at = now
        if self.depth:
            self.leave()
