"""A training step on the timeline: per micro-step the layers' forward and backward on the compute stream, and on
the one network stream ZeRO-3's parameter gathers and the gradients' bucketed collectives, overlapping only
where the schedule allows.

- ZeRO-3 gathers each layer's parameters before its forward and again before its backward; a gather is
  prefetched one layer ahead (issued when the layer before starts computing: the memory plan holds two
  gathered layers), so a layer waits when its gather is late.
- A gradient bucket is reduced (all-reduce, or reduce-scatter under ZeRO 2/3) once the backward has produced
  it (buckets fill in backward order, evenly over the layers); DDP and ZeRO 1 reduce only in the last
  micro-step (no_sync before), ZeRO 2/3 in every one.
- All collectives share the network stream, in the order they are issued: a micro-step's reduce-scatters
  hold up the next micro-step's gathers.
- The optimizer update runs once the last gradient collective is done; ZeRO 1/2's gather of the updated
  parameters follows it, exposed.

The step ends when both streams are done; what the network adds beyond the compute is exposed communication,
attributed per kind to the network time during which the compute stream was idle.

With ``spans``, the schedule is also laid out for a trace (``trace.py``): the layers' forward and backward on the
device's ``Recipe`` row (the compute stream), the optimizer update on ``TPC`` (elementwise, as the cost model
places it), the gathers and gradient collectives on ``Network``, and the optimizer step on the host's ``Steps``
row with its parts; every span an estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .model import Span

MAX_SPANS = 500_000  # past it a trace keeps the schedule's times but stops adding spans (and says so)


@dataclass(frozen=True)
class TrainingStep:
    layers: int
    forward_s: float  # one micro-step's forward (compute and its exposed tensor-parallel all-reduces)
    backward_s: float  # one micro-step's backward (with the recompute under checkpointing)
    accumulation: int
    gather_s: float = 0.0  # ZeRO 3: one layer's parameter all-gather (0: no gathers)
    grads: tuple = ()  # (kind, seconds of one bucket, buckets per reduction, every micro-step?)
    optimizer_s: float = 0.0
    after: tuple = ()  # (kind, seconds) after the optimizer update


@dataclass
class _Streams:
    compute: float = 0.0
    net: float = 0.0
    busy: list = field(default_factory=list)  # compute spans (start, end)
    sent: list = field(default_factory=list)  # network spans (start, end, kind)
    spans: list | None = None  # the trace's spans, when asked for
    truncated: bool = False

    def run(self, seconds: float, ready: float, name: str = "", args: dict | None = None,
            row: str = "Recipe") -> tuple[float, float]:
        start = max(self.compute, ready)
        self.compute = start + seconds
        self.busy.append((start, self.compute))
        self._keep(row, name, start, seconds, args)
        return start, self.compute

    def send(self, kind: str, seconds: float, ready: float, name: str = "", args: dict | None = None) -> float:
        start = max(self.net, ready)
        self.net = start + seconds
        self.sent.append((start, self.net, kind))
        self._keep("Network", name or kind, start, seconds, {"kind": kind, **(args or {})})
        return self.net

    def _keep(self, row: str, name: str, start: float, seconds: float, args: dict | None) -> None:
        if self.spans is None or seconds <= 0:
            return
        if len(self.spans) >= MAX_SPANS:
            self.truncated = True
            return
        self.spans.append(Span("device", row, name, start, seconds, {**(args or {}), "estimate": True}))


def schedule(step: TrainingStep, spans: bool = False) -> dict:
    """``step_s``, ``compute_s`` (busy) and ``exposed_s`` per collective kind of one optimizer step; with
    ``spans``, also ``spans`` (the trace's, ``model.Span``) and ``truncated``."""
    s, layers = _Streams(spans=[] if spans else None), max(step.layers, 1)
    for m in range(step.accumulation):
        _layers(s, step.forward_s / layers, layers, step.gather_s, None, m)
        grads = [g for g in step.grads if g[3] or m == step.accumulation - 1]
        _layers(s, step.backward_s / layers, layers, step.gather_s, grads, m)
    grads_done = s.net
    _, done = s.run(step.optimizer_s, grads_done, "optimizer step (AdamW)", {"after": "the last gradient collective"},
                    row="TPC")
    for kind, seconds in step.after:
        s.send(kind, seconds, done, f"{kind} of the updated parameters")
    end = max(s.compute, s.net)
    out = {"step_s": end, "compute_s": sum(e - b for b, e in s.busy), "exposed_s": _exposed(s.busy, s.sent)}
    if spans:
        out.update(spans=s.spans + [_step_span(step, out, s)], truncated=s.truncated)
    return out


def _step_span(step: TrainingStep, out: dict, s: _Streams) -> Span:
    """The optimizer step on the host's ``Steps`` row, its parts in the fields a step-timeline trace carries."""
    net = sum(e - b for b, e, _ in s.sent)
    parts = {"step": 0, "time_s": out["step_s"], "host_s": 0.0, "device_s": out["compute_s"], "sync_s": 0.0,
             "compile_s": 0.0, "engines": {"MME": 0.0, "TPC": step.optimizer_s, "DMA": 0.0, "Network": net},
             "exposed_s": out["exposed_s"], "micro_steps": step.accumulation, "layers": step.layers,
             "bound": "network" if out["step_s"] > out["compute_s"] else "device", "estimate": True}
    return Span("host", "Steps", "optimizer step", 0.0, out["step_s"], parts)


def _layers(s: _Streams, each: float, layers: int, gather_s: float, grads: list | None, micro: int = 0) -> None:
    """One pass over the layers (forward, or backward with ``grads``: its buckets sent as they fill); the
    backward runs the layers last to first."""
    pass_ = "forward" if grads is None else "backward"
    order = range(layers) if grads is None else range(layers - 1, -1, -1)
    ready = s.send("all_gather", gather_s, s.compute, f"all_gather layer {order[0]} ({pass_})",
                   {"micro_step": micro, "layer": order[0]}) if gather_s else 0.0
    sent = [0] * len(grads or [])
    for i, layer in enumerate(order):
        start, end = s.run(each, ready, f"{pass_} layer {layer}", {"micro_step": micro, "layer": layer})
        if gather_s and i + 1 < layers:  # prefetched one layer ahead
            ready = s.send("all_gather", gather_s, start, f"all_gather layer {order[i + 1]} ({pass_})",
                           {"micro_step": micro, "layer": order[i + 1]})
        for g, (kind, seconds, buckets, _) in enumerate(grads or []):
            filled = buckets if i + 1 == layers else math.floor(buckets * (i + 1) / layers)
            for b in range(sent[g], filled):
                s.send(kind, seconds, end, f"{kind} bucket {b + 1}/{buckets}", {"micro_step": micro, "bucket": b + 1})
            sent[g] = filled


def _exposed(busy: list, sent: list) -> dict[str, float]:
    """Per kind, the network time during which the compute stream was idle (both lists in time order)."""
    out: dict[str, float] = {}
    j = 0
    for start, end, kind in sent:
        while j < len(busy) and busy[j][1] <= start:
            j += 1
        covered, k = 0.0, j
        while k < len(busy) and busy[k][0] < end:
            covered += max(min(end, busy[k][1]) - max(start, busy[k][0]), 0.0)
            k += 1
        out[kind] = out.get(kind, 0.0) + (end - start) - covered
    return out
