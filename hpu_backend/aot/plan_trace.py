"""A trace of a warm-up or an analysis: each shape point one step of the timeline, its recipes launched in
order, with the lowering time of the recipes the point built on the host's compile row.

A compile-only run executes nothing on a device, so the device rows are the recipes' cost model (estimates),
the launch rows the bridge's constants, and a point's compile span its measured wall time on this host
(lowering and, for ``warm``, the simulated run) shared among the recipes it built.
"""

from __future__ import annotations

from ..timeline import trace, whatif
from ..timeline.model import cost_of
from .reports import PointResult


def events(points: list[PointResult]) -> list[tuple]:
    ids: dict[int, int] = {}
    out: list[tuple] = []
    for p in points:
        built = [u for u in p.used if u.compiled_for] or []
        share = p.seconds / len(built) if built else 0.0
        for u in p.used:
            rid = ids.setdefault(id(u.recipe), len(ids) + 1)
            out.append(("launch", "compiled", u.recipe.name, rid, cost_of(u.recipe.facts),
                        share if u.compiled_for else 0.0))
        out.append(("step",))
    return out


def write(path: str, points: list[PointResult], target: str, tool: str) -> None:
    """Write the points' trace to ``path`` (``TraceError``: one line)."""
    schedule = whatif.schedule(events(points), target, spans=True)
    trace.write(path, schedule.spans, 0, {"target": target, "tool": tool, "steps": [p.label for p in points],
                                          "note": "each step is one shape point of the model file"})
