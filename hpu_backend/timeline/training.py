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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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

    def run(self, seconds: float, ready: float) -> tuple[float, float]:
        start = max(self.compute, ready)
        self.compute = start + seconds
        self.busy.append((start, self.compute))
        return start, self.compute

    def send(self, kind: str, seconds: float, ready: float) -> float:
        start = max(self.net, ready)
        self.net = start + seconds
        self.sent.append((start, self.net, kind))
        return self.net


def schedule(step: TrainingStep) -> dict:
    """``step_s``, ``compute_s`` (busy) and ``exposed_s`` per collective kind of one optimizer step."""
    s, layers = _Streams(), max(step.layers, 1)
    for m in range(step.accumulation):
        _layers(s, step.forward_s / layers, layers, step.gather_s, None)
        grads = [g for g in step.grads if g[3] or m == step.accumulation - 1]
        _layers(s, step.backward_s / layers, layers, step.gather_s, grads)
    grads_done = s.net
    _, done = s.run(step.optimizer_s, grads_done)
    for kind, seconds in step.after:
        s.send(kind, seconds, done)
    end = max(s.compute, s.net)
    return {"step_s": end, "compute_s": sum(e - b for b, e in s.busy), "exposed_s": _exposed(s.busy, s.sent)}


def _layers(s: _Streams, each: float, layers: int, gather_s: float, grads: list | None) -> None:
    """One pass over the layers (forward, or backward with ``grads``: its buckets sent as they fill)."""
    ready = s.send("all_gather", gather_s, s.compute) if gather_s else 0.0
    sent = [0] * len(grads or [])
    for i in range(layers):
        start, end = s.run(each, ready)
        if gather_s and i + 1 < layers:
            ready = s.send("all_gather", gather_s, start)  # prefetched one layer ahead
        for g, (kind, seconds, buckets, _) in enumerate(grads or []):
            filled = buckets if i + 1 == layers else math.floor(buckets * (i + 1) / layers)
            for _ in range(filled - sent[g]):
                s.send(kind, seconds, end)
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
