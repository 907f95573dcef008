"""What a change to the script would save, read off the timeline: the run's events changed as the change would
change them, scheduled again, and the steady step compared (no threshold anywhere).

- ``syncs``: the host reads at one source line dropped (``print(loss.item())`` every step);
- ``pinned``: every host→device copy from pinned memory with ``non_blocking=True``;
- ``loader``: the Python before each step's first host→device copy taken off (more loader workers prefetch it);
- ``hpu_graphs``: a step's ops and launches replaced by one HPU-graph replay of the same device work.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .host import HOST, HostCosts
from .model import Cost, Schedule, StepTime, mean_step_s


def schedule(events: Iterable[tuple], target: str, host: HostCosts = HOST, spans: bool = False) -> Schedule:
    s = Schedule(target, host, spans).run(events)
    s.finish()
    return s


def step_s(events: list[tuple], target: str, host: HostCosts = HOST) -> float:
    """The mean steady step time of ``events``."""
    return mean_step_s(schedule(events, target, host).steps[:-1])


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
