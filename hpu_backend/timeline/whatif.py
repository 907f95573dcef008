"""What a change to the script would save, read off the timeline: the run's events changed as the change would
change them, scheduled again, and the steady step compared (no threshold anywhere).

- ``syncs``: the host reads at one source line dropped (``print(loss.item())`` every step);
- ``pinned``: every host→device copy from pinned memory with ``non_blocking=True``;
- ``loader``: the Python before each step's first host→device copy taken off (more loader workers prefetch it);
- ``hpu_graphs``: a step's ops and launches replaced by one HPU-graph replay of the same device work.

The steady step leaves compiles out: where every step it can pick compiled (a run of one step, or one that
compiles throughout), it is those steps scheduled again without their compiles (``steady_steps``).
"""

from __future__ import annotations

from typing import Callable, Iterable

from .host import HOST, HostCosts
from .model import Cost, Schedule, StepTime, steady


def schedule(events: Iterable[tuple], target: str, host: HostCosts = HOST, spans: bool = False) -> Schedule:
    s = Schedule(target, host, spans).run(events)
    s.finish()
    return s


def step_s(events: list[tuple], target: str, host: HostCosts = HOST) -> float:
    """The mean steady step time of ``events``."""
    rows = steady_steps(events, target, host)
    return sum(s.time_s for s in rows) / len(rows) if rows else 0.0


def steady_steps(events: list[tuple], target: str, host: HostCosts = HOST,
                 steps: list[StepTime] | None = None) -> list[StepTime]:
    """The steady steps (``model.steady``; of ``steps`` when given, ``events`` scheduled); when one of those
    compiled, the same steps scheduled again without their compiles: a compile is on the timeline (its span) but
    is not the steady state the step reports."""
    rows = steady(steps_of(events, target, host) if steps is None else steps)
    if any(s.compile_s for s in rows):
        again = steps_of(without_compiles(events), target, host)
        rows = [again[s.step] for s in rows]
    return rows


def without_compiles(events: list[tuple]) -> list[tuple]:
    """Every recipe launched as if it had been built before (its first launch's lowering time dropped)."""
    return [(*e[:5], 0.0) if e[0] == "launch" and e[5] else e for e in events]


def gain(events: list[tuple], change: Callable[[list[tuple]], list[tuple]], target: str,
         host: HostCosts = HOST) -> float:
    """Seconds per steady step that ``change`` saves (≥ 0)."""
    return max(step_s(events, target, host) - step_s(change(events), target, host), 0.0)


def without_syncs(source: str | None = None) -> Callable[[list[tuple]], list[tuple]]:
    """Drop the host reads at ``source`` (every one when None)."""
    return lambda events: [e for e in events if not (e[0] == "sync" and (source is None or e[2] == source))]


def pinned(events: list[tuple]) -> list[tuple]:
    return [("copy", e[1], e[2], True, True, e[5]) if e[0] == "copy" and e[2] else e for e in events]


def loader(events: list[tuple]) -> list[tuple]:
    out, copied = [], False
    for e in events:
        if e[0] == "step":
            copied = False
        elif e[0] == "copy" and e[2]:
            copied = True
        elif e[0] == "py" and not copied:
            continue
        out.append(e)
    return out


def hpu_graphs(events: list[tuple]) -> list[tuple]:
    """Each run of ops and launches between two copies, syncs or step ends becomes one replay of their device
    work (the user's Python stays)."""
    out, clusters, comms, names = [], [], [], []

    def replay() -> None:
        if clusters or names:
            out.append(("launch", "replay", "hpu_graph(" + "+".join(dict.fromkeys(names)) + ")", 0,
                        Cost(tuple(clusters), tuple(comms)), 0.0))
        clusters.clear(), comms.clear(), names.clear()

    for e in events:
        if e[0] == "op":
            continue
        if e[0] == "launch":
            cost: Cost = e[4]
            comms.extend((k, s, i + len(clusters)) for k, s, i in cost.comms)
            clusters.extend(cost.clusters)
            names.append(e[2])
            continue
        if e[0] != "py":
            replay()
        out.append(e)
    replay()
    return out


def steps_of(events: list[tuple], target: str, host: HostCosts = HOST) -> list[StepTime]:
    return schedule(events, target, host).steps[:-1]
