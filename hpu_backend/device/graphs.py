"""``torch.hpu.HPUGraph`` and ``torch.hpu.graph``: Gaudi's explicit HPU-graph capture, on the simulated device.

Between ``capture_begin()`` and ``capture_end()`` every op on the device is recorded into one graph, in eager
mode as in lazy mode (what was pending runs first). ``capture_end()`` compiles the graph (the lazy graphs' runner:
the same lowering, recipes and cache) and runs it once, so the capture's results hold their values at once, as on
Gaudi, where capturing runs the work too. The graph keeps the tensors it read (its static inputs: the caller
refills them in place before a replay) and the tensors it filled (its static outputs). ``replay()`` runs it
again on the inputs' current values and writes the results into those same output tensors, and its in-place
writes (a copy into a view of a flat buffer) into the tensors it wrote; nothing is recorded.

What needs the host during a capture cannot be captured and is a one-line error that ends the capture: a read of
a device value (``item()``, printing, a copy to the host), an op no graph can hold (its result's shape depends on
values, a collective), a compiled graph reading device tensors. Captures do not nest.

Unlike Gaudi, a replay runs on the host, synchronously; the device's estimate counts it as one launch of the
graph's recipe, with no per-op host cost.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._mode_utils import no_dispatch

from ..capture.lazy import LazyRecorder, Pending, user_line
from ..errors import HpuBackendError
from ..timeline.record import launching
from .context import current_context, current_device


class HPUGraphError(HpuBackendError, RuntimeError):
    """An HPU graph used out of order, or work that cannot be captured: one line."""


class HPUGraph:
    """One captured graph of device work: ``capture_begin()``, the work, ``capture_end()``, then ``replay()``."""

    def __init__(self):
        self._capture: _Capture | None = None
        self._replay: _Replay | None = None
        self._captured = False

    def capture_begin(self, dry_run: bool = False) -> None:
        """Record the device's ops from now on into this graph (``dry_run`` is accepted and changes nothing)."""
        device = current_device()
        if device.capture is not None:
            raise HPUGraphError("an HPU graph capture is already under way: captures do not nest")
        with device.lock:
            device.timeline.enter()
            try:
                device.flush("HPUGraph.capture_begin")  # what was pending runs first: it is not part of the graph
            finally:
                device.timeline.leave()
            self.reset()
            self._capture = _Capture(device)

    def capture_end(self) -> None:
        """Compile the recorded graph and run it once: its outputs hold their values; ``replay()`` may follow."""
        capture, self._capture = self._capture, None
        if capture is None or capture.device.capture is not capture:
            raise HPUGraphError("HPUGraph.capture_end() without a capture under way (capture_begin() first; a "
                                "capture that failed has ended)")
        self._replay = capture.end()
        self._captured = True

    def replay(self, asynchronous: bool = False) -> None:
        """Run the captured graph again on its inputs' current values, into its outputs (``asynchronous`` is
        accepted: the simulated device runs it now)."""
        if not self._captured:
            raise HPUGraphError("HPUGraph.replay() before capture_end(): nothing has been captured")
        if self._replay is not None:  # (a capture that recorded no op replays nothing)
            self._replay()

    def reset(self) -> None:
        """Forget the captured graph (its tensors are no longer held)."""
        self._replay, self._captured = None, False


class graph:
    """``with torch.hpu.graph(g):`` captures the block's device work into ``g`` (``capture_begin`` on entry,
    ``capture_end`` on exit; an error in the block ends the capture and propagates). ``stream`` and ``dry_run``
    are accepted and change nothing: work runs as it is issued."""

    def __init__(self, hpu_graph: HPUGraph, stream=None, dry_run: bool = False):
        if not isinstance(hpu_graph, HPUGraph):
            raise HPUGraphError(f"torch.hpu.graph() takes a torch.hpu.HPUGraph, not {type(hpu_graph).__name__}")
        self.hpu_graph = hpu_graph

    def __enter__(self) -> None:
        self.hpu_graph.capture_begin()

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.hpu_graph.capture_end()
            return
        capture, self.hpu_graph._capture = self.hpu_graph._capture, None
        if capture is not None and capture.device.capture is capture:
            capture.restore()


class _Capture(LazyRecorder):
    """The device's recorder while a capture is under way: a cut of the graph before ``end()`` is an error."""

    def __init__(self, device):
        base = device.recorder
        super().__init__(self._refused_cut, base.on_sync, base.known)
        if base._fake_mode is not None:  # the op layouts the device has seen: a capture of them runs no fake op
            self._fake_mode, self.layouts = base._fake_mode, base.layouts
        self.device, self.base, self.was_lazy = device, base, device.lazy
        device.recorder, device.lazy, device.capture = self, True, self

    def restore(self) -> None:
        """The device records into its own recorder again, in its own mode."""
        device = self.device
        device.recorder, device.lazy, device.capture = self.base, self.was_lazy, None

    def refuse(self, what: str, source: str, why: str) -> None:
        """End the capture with a one-line error: ``what`` cannot be captured."""
        self.restore()
        where = f" at {source}" if source else ""
        raise HPUGraphError(f"{what}{where} cannot be captured in an HPU graph: {why}")

    def _refused_cut(self, pending: Pending) -> list:
        self.refuse(pending.reason, pending.source, "the graph would have to run before capture_end()")

    def _eager(self, func, args, kwargs, why: str):
        self.refuse(str(func), user_line(), f"it runs on the host ({why})")

    def end(self) -> _Replay | None:
        """The recorded graph compiled and run once (its outputs filled); what replays it (None: nothing was
        recorded)."""
        device = self.device
        runner = current_context().lazy.runner
        kept: list = []

        def run(pending: Pending) -> list:
            graph = runner.prepare(pending)
            kept.append(_Replay(device, graph, pending, runner.ledger.step.graphs[-1]))
            return graph(list(pending.inputs))

        self.run = run
        with device.lock:
            device.timeline.enter()
            try:
                self.flush("HPUGraph.capture_end", user_line())
            finally:
                self.restore()
                device.timeline.leave()
        return kept[0] if kept else None


class _Replay:
    """A captured graph with the tensors it reads (static inputs) and fills (static outputs)."""

    def __init__(self, device, graph, pending: Pending, run):
        self.device = device
        self.graph = graph
        self.inputs = pending.inputs
        self.outputs = pending.fill
        self.run = run  # the ledger's record of the capture's run, which each replay repeats

    def __call__(self) -> None:
        device = self.device
        with device.lock:
            device.timeline.enter()
            try:
                device.flush("an HPU graph replay reads its inputs")  # pending work (refilling them) runs first
                with launching("replay"), no_dispatch(), torch.no_grad(), torch._C.DisableTorchFunction():
                    values = self.graph(list(self.inputs))
                    for t, v in zip(self.outputs, values):
                        t.copy_(v)
            finally:
                device.timeline.leave()
            device.ledger.step.graphs.append(dataclasses.replace(self.run, cut_by="HPUGraph.replay", source=user_line(),
                                                          compiled=0, new=""))
