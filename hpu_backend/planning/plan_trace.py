"""A trace of a warm-up or an analysis: each shape point one step of the timeline, its recipes launched in
order, with the lowering time of the recipes the point built on the host's compile row; of a capacity plan:
one request, its prefill and decode steps as a serving loop runs them (one graph replay per step, the sampled
tokens read back before the next); and of a training plan: one optimizer step as ``timeline/training.py``
schedules it (every rank runs the same schedule, so one file stands for each of them).

A compile-only run executes nothing on a device, so the device rows are the recipes' cost model (estimates),
the launch rows the bridge's constants, and a point's compile span its measured wall time on this host
(lowering and, for ``warm``, the simulated run) shared among the recipes it built.
"""

from __future__ import annotations

from ..timeline import trace, whatif
from ..timeline.model import Cost, cost_of
from ..shipping.reports import PointResult


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


# -- a served request (capacity planning) ------------------------------------------------------------------


def request_events(prefill, decode, batch: int, input_len: int, kv_lens: list[int]) -> list[tuple]:
    """The prefill step, then the decode steps at the KV lengths the planner evaluates (``kv_lens``), each a
    step of the timeline whose sampled tokens the host reads (a sync) before it launches the next."""
    steps = [("prefill", prefill, {"batch": batch, "input_len": input_len})]
    steps += [(f"decode kv={kv}", decode, {"batch": batch, "kv_len": kv}) for kv in kv_lens]
    out: list[tuple] = []
    for rid, (name, step, point) in enumerate(steps, 1):
        out += [("launch", "replay", name, rid, step_cost(step, point), 0.0), ("sync", "sample tokens", name),
                ("step",)]
    return out


def step_cost(step, point) -> Cost:
    """A step's Cost; a layered step (``capacity.LayeredStep``) as its one-group recipe plus, per further group of
    layers, one kernel of what the two-group recipe adds (the planner's own linear extension in depth)."""
    if not hasattr(step, "one"):
        return cost_of(step.at(point).facts)
    one, two = cost_of(step.one.at(point).facts), cost_of(step.two.at(point).facts)
    layer = tuple(max(sum(c[k] for c in two.clusters) - sum(c[k] for c in one.clusters), 0.0) for k in range(5))
    comm = sum(c[1] for c in two.comms) - sum(c[1] for c in one.comms)
    extra = len(one.clusters)
    comms = one.comms + tuple(("all_reduce", max(comm, 0.0), extra + i) for i in range(step.groups - 1) if comm > 0)
    return Cost(one.clusters + (layer,) * (step.groups - 1), comms, one.cpu_s, one.transfer_s)


def write_request(path: str, prefill, decode, doc: dict, kv_lens: list[int]) -> None:
    """The trace of one request at the plan's batch, decoding at ``kv_lens`` (``TraceError``: one line)."""
    events = request_events(prefill, decode, doc["batch"], doc["input_len"], kv_lens)
    schedule = whatif.schedule(events, doc["target"], spans=True)
    trace.write(path, schedule.spans, 0, {"target": doc["target"], "tool": "analyze (capacity)",
                                          "cards": doc["cards"], "batch": doc["batch"],
                                          "note": "prefill, then the decode steps the planner evaluates (sampled)"})


def write_training(path: str, spans: list, doc: dict) -> None:
    """The trace of a training plan's optimizer step (``TraceError``: one line)."""
    lay = doc["layout"]
    trace.write(path, spans, 0, {"target": doc["target"], "tool": "analyze (training)", "cards": doc["cards"],
                                 "layout": lay, "seq": doc["seq"], "global_batch": doc["global_batch"],
                                 "note": f"one optimizer step of one rank; all {doc['cards']} ranks run this "
                                         f"schedule ({lay['dp']} data-parallel × {lay['tp']} tensor-parallel)"})
