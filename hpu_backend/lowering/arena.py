"""Offset assignment for the intermediates arena: greedy by size, first fit among time-overlapping buffers.

Each buffer has a size and a lifetime ``[first, last]`` in schedule steps. Buffers are placed
largest first at the lowest offset where they overlap no already-placed buffer whose lifetime
intersects theirs (the "greedy by size" planner of TFLite and XLA's heap simulator). Two buffers
live at the same step never share bytes; buffers live at different steps may.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int
    first: int
    last: int


def assign_offsets(buffers: list[Buffer]) -> tuple[dict[str, int], int]:
    """Offsets by buffer name, and the arena size (the largest offset + size)."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, buffers[i].name))
    n = len(buffers)
    # Placed buffers' lifetimes and byte ranges as int64 vectors: the overlap test is one vector op.
    first, last, start, end = torch.empty((4, n), dtype=torch.int64)
    offsets: dict[str, int] = {}
    arena = 0
    for placed, i in enumerate(order):
        b = buffers[i]
        live = (first[:placed] <= b.last) & (last[:placed] >= b.first)
        offset = _first_fit(start[:placed][live], end[:placed][live], b.size)
        first[placed], last[placed], start[placed], end[placed] = b.first, b.last, offset, offset + b.size
        offsets[b.name] = offset
        arena = max(arena, offset + b.size)
    return offsets, arena


def _first_fit(starts: torch.Tensor, ends: torch.Tensor, size: int) -> int:
    """The lowest offset where ``size`` bytes fit between the occupied [start, end) ranges."""
    offset = 0
    for s, e in sorted(zip(starts.tolist(), ends.tolist())):
        if s - offset >= size:
            return offset
        offset = max(offset, e)
    return offset


def peak_live(buffers: list[Buffer]) -> int:
    """The largest total size of buffers live at one step (a lower bound for any arena)."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.first] = events.get(b.first, 0) + b.size
        events[b.last + 1] = events.get(b.last + 1, 0) - b.size
    peak = live = 0
    for step in sorted(events):
        live += events[step]
        peak = max(peak, live)
    return peak
