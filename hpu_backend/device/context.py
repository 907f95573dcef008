"""The device context: the one owner of the hpu device's state, reached through ``current_context()``.

A ``DeviceContext`` holds everything the device keeps between two calls: its memory (``memory.py``), its lazy
engine (the recorder and the runner, ``lazy.py``), its one step ledger (what each step ran, compiled, synced and
cost), and the enabled ``Device`` (``dispatch.py``: the mode, the settings, placement and the step timeline).
Nothing else in ``hpu_backend.device`` keeps state from one call to the next: every module reaches the
device's state through the context in use, and the context makes every step-end call itself (``mark_step``:
the timeline stops the user's clock, the lazy engine runs the pending graph, the ledger ends the step, the
timeline marks the boundary), so no module subscribes to another.

The process has one handle (``_OWNER``): the context in use, made at its first use (nothing is done at import),
and torch's registrations of the device, which are made once per process and outlive any context.
``fresh_context()`` puts a new, empty context in use for a block (tests, a second run in one process) and the
previous one back after it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

from ..serve.session import observe_every_run
from .lazy import LazyEngine, LazyReport, Ledger
from .memory import Memory
from ..errors import HpuBackendError


class DeviceSetupError(HpuBackendError, RuntimeError):
    """The hpu device cannot be enabled here (another PrivateUse1 backend, a bad mode) or is not enabled: one
    line."""


class DeviceContext:
    """The hpu device's state: memory, lazy engine, step ledger, and the enabled device (None before
    ``enable()``)."""

    def __init__(self):
        self.memory = Memory()
        self.ledger = Ledger()
        self.lazy = LazyEngine(self.ledger)
        self.device = None  # the enabled Device (dispatch.py): mode, settings, placement, timeline
        self.pinned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # data pointer -> pinned tensor
        self.stream = None  # torch.hpu.current_stream(), made at its first call
        # FusedSDPA's recompute_mode=None: recompute, as Gaudi's bridge starts (gaudi/sdpa.py's names set it)
        self.recompute_sdp = True

    def counted_memory(self) -> Memory:
        """The memory, counting the runs of compiled graphs from now on (the device starts it, and so does the
        first reading of a counter)."""
        if not self.memory.started:
            observe_every_run(_count_run)  # once per process: it counts into the context in use
            self.memory.started = True
        return self.memory

    def mark_step(self) -> None:
        """The step ends: the simulator's time starts, the pending lazy graph runs, the ledger ends the step, the
        timeline marks the boundary and gives the clock back to the user."""
        device = self.device
        if device is not None:
            device.timeline.enter()
        self.lazy.flush_step()
        self.ledger.end_step(self.ops())
        if device is not None:
            device.timeline.step_end()

    def ops(self) -> int:
        """The ops issued on the device so far."""
        return self.device.ops if self.device is not None else 0

    def release_device(self) -> None:
        """The device leaves its mode (another mode follows, or none): what it left pending runs, and the step
        ends with the ops it issued."""
        self.lazy.release_device()
        if self.device is not None:
            self.ledger.end_step(self.ops())
            self.ledger.ops_at_start = 0  # the next device counts its ops from zero

    def close(self) -> None:
        """Run what the device left pending; the context keeps its ledger and counters for reading."""
        self.release_device()
        self.device = None

    def on_run(self, recipe) -> None:
        """A recipe of the device's session ran: its estimated time is the step's, its launch is on the timeline."""
        self.ledger.on_run(recipe)
        if self.device is not None:
            self.device.timeline.launch(recipe, self.device.launch_kind())


class _Owner:
    """The process's handle on the device: the context in use and torch's registrations of the device."""

    __slots__ = ("context", "registration")

    def __init__(self):
        self.context: DeviceContext | None = None
        self.registration: tuple | None = None  # the kernels' libraries, kept alive (setup.py)


_OWNER = _Owner()


def current_context() -> DeviceContext:
    """The device context in use (made at the first call)."""
    context = _OWNER.context
    if context is None:
        context = _OWNER.context = DeviceContext()
    return context


@contextlib.contextmanager
def fresh_context() -> Iterator[DeviceContext]:
    """A new, empty context in use for the block (its device not enabled yet); the previous one after it."""
    prior, fresh = _OWNER.context, DeviceContext()
    _OWNER.context = fresh
    try:
        yield fresh
    finally:
        fresh.close()
        _OWNER.context = prior


def registration() -> tuple | None:
    return _OWNER.registration


def set_registration(libs: tuple) -> None:
    """Keep torch's registrations of the device for the life of the process (they cannot be undone)."""
    _OWNER.registration = libs


def current_device():
    """The enabled device of the context in use; DeviceSetupError before ``enable()``."""
    context = _OWNER.context
    device = context.device if context is not None else None
    if device is None:
        raise DeviceSetupError("the hpu device is not enabled: call hpu_backend.device.enable() first")
    return device


def enabled_device():
    """The enabled device of the context in use, None before ``enable()``."""
    context = _OWNER.context
    return context.device if context is not None else None


def before_compiled() -> None:
    """A compiled graph is about to read device tensors: the device's pending work runs first."""
    device = enabled_device()
    if device is not None:
        device.before_compiled()


def _count_run(recipe, args: list, outputs) -> None:
    """A run of any session's graph: counted by the memory of the context in use (once it counts)."""
    context = _OWNER.context
    if context is not None:
        context.memory.on_run(recipe, args, outputs)


def on_device_run(recipe, args: list, outputs) -> None:
    """A run of a graph of the device's session: the context in use records it."""
    context = _OWNER.context
    if recipe is not None and context is not None:
        context.on_run(recipe)


# -- lazy mode under Gaudi's names (``hpu_backend.gaudi``) ----------------------------------------------------------

def mark_step() -> None:
    """End the step: run the pending lazy graph (in lazy mode), and start the next step of the ledger."""
    current_context().mark_step()


@contextlib.contextmanager
def lazy(options: dict | None = None):
    """Lazy mode for this block (this thread), on host tensors: ops accumulate into graphs cut at ``mark_step()``
    and host reads. ``options`` are backend options (``target``, ``cache``, ...) for the graphs of this block;
    without them, the environment's. Nested blocks share the outer block's."""
    context = current_context()
    context.lazy.enter(options)
    try:
        yield
    finally:
        if context.lazy.exit():
            context.ledger.end_step(context.ops())


def is_lazy() -> bool:
    """Whether ops are recorded lazily now: a ``lazy()`` block is open, or the device runs in lazy mode."""
    context = _OWNER.context
    if context is None:
        return False
    return context.lazy.depth > 0 or context.device is not None and context.device.mode == "lazy"


def lazy_report() -> LazyReport:
    """The steps of this context's lazy-mode run so far that ran graphs or synced (empty if lazy mode never
    ran)."""
    context = _OWNER.context
    return LazyReport() if context is None else context.ledger.lazy_report()
