"""``report()``: what a run did on the hpu device, as plain JSON-ready data for the end-of-run summary.

Per step (from one ``mark_step()`` to the next): the ops the script issued on the device, the lazy graphs and
the recipes compiled for them (the steady state compiles nothing), why each new graph is new, and the
estimated device time of the recipes that ran (their cost model's ``total_s``, an estimate). Across the run:
recompiles with their causes (Dynamo's and the lazy graphs'), CPU fallbacks (op, dtypes, count), host syncs
with the user's source lines, and peak device memory against the HBM capacity.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .. import metrics
from ..serve import fallback
from ..timeline import whatif
from ..timeline.host import HOST

TIMELINE_STEPS = 1_000  # steps of the timeline the report lists one by one (its means cover all)


def build(device, context) -> dict[str, Any]:
    """The report of ``device``, the enabled device of ``context`` (``context.py``), from the context's ledger and
    memory."""
    ledger, memory = context.ledger, context.memory
    steps = _steps(device, ledger)
    graphs = _graph_steps(ledger) if device.mode == "lazy" else []
    steady = [s["estimated_device_s"] for s in steps[2:]] or [s["estimated_device_s"] for s in steps]
    return {
        "mode": device.mode,
        "release": device.release,  # the Gaudi software release simulated (device/release.py)
        "target": device.settings.target,
        "steps": steps,
        "lazy_graph_steps": graphs,
        "recipes_compiled": sum(s["recipes_compiled"] for s in graphs),
        "recompiles": [{"kind": "dynamo", **{k: str(v) for k, v in r.items()}} for r in metrics.recompiles()]
        + _lazy_recompiles(ledger),
        "op_layouts_compiled": op_layouts(device),
        "cpu_fallbacks": _fallbacks(device),
        "host_syncs": _syncs(device),
        "memory": {"peak_bytes": memory.max_allocated(), "in_use_bytes": memory.allocated(),
                   "hbm_bytes": memory.capacity()},
        "estimated_device_s_per_step": sorted(steady)[len(steady) // 2] if steady else 0.0,
        "timeline": timeline(device),
    }


def timeline(device) -> dict[str, Any]:
    """The run's step timeline (estimates): the mean steady step and its parts, what bounds it, each step's; the
    compiles (measured lowering) apart, never in the steady step (``whatif.steady_steps``)."""
    events = device.timeline.events
    steps = whatif.steps_of(events, device.settings.target)
    rows = whatif.steady_steps(events, device.settings.target, steps=steps)
    n = len(rows) or 1
    mean = {k: sum(getattr(s, k) for s in rows) / n for k in ("time_s", "host_s", "python_s", "device_s", "serial_s")}
    bounds = Counter(s.bound for s in rows)
    return {"estimate": True, "step_s": mean["time_s"], "host_s": mean["host_s"], "python_s": mean["python_s"],
            "device_s": mean["device_s"], "sync_s": mean["serial_s"],
            "bound": bounds.most_common(1)[0][0] if bounds else "", "steady_steps": [s.step for s in rows],
            "compiles": _compiles(steps, rows), "measured": _measured(rows),
            "steps": [s.summary() for s in steps[:TIMELINE_STEPS]],
            "truncated": device.timeline.truncated, "host_constants": _constants()}


def _measured(rows: list) -> dict[str, Any] | None:
    """What the steady steps took on this host (measured from ``mark_step`` to ``mark_step``), beside the
    estimate: the script's Python with torch's own dispatch around it (the estimate's measured part), and the
    simulator's own work (its lowering, dispatch and host kernels: what no Gaudi spends)."""
    timed = [s for s in rows if s.wall_s is not None]
    if not timed:
        return None
    n = len(timed)
    wall, python, simulator = (sum(getattr(s, k) for s in timed) / n for k in ("wall_s", "python_s", "simulator_s"))
    return {"wall_s": wall, "python_s": python, "simulator_s": simulator, "steps": [s.step for s in timed]}


def _compiles(steps: list, rows: list) -> dict[str, Any]:
    """The run's compiles, measured: the first step's, all of them, the steps that had some, and whether the
    steady step is a compiling step taken without them."""
    compiled = [s.step for s in steps if s.compile_s > 0]
    return {"first_step_s": steps[0].compile_s if steps else 0.0, "total_s": sum(s.compile_s for s in steps),
            "steps": compiled, "left_out_of_steady": bool(set(compiled) & {s.step for s in rows}),
            "measured": "lowering on this host (not Gaudi's graph compiler)"}


def _constants() -> dict[str, float]:
    return {k: getattr(HOST, k) for k in ("eager_op_s", "lazy_op_s", "lazy_graph_s", "recipe_launch_s",
                                           "graph_replay_s", "sync_s", "staging_bytes_per_s")}


def _steps(device, ledger) -> list[dict]:
    """Per step: the ops issued on the device and the estimated device time of the recipes that ran."""
    rows = [{"ops": s.ops, "estimated_device_s": s.estimated_device_s, "step": s.index} for s in ledger.steps]
    rows[-1]["ops"] = device.ops - ledger.ops_at_start  # the step under way
    return [r for r in rows if r["ops"] or r["estimated_device_s"]]


def _graph_steps(ledger) -> list[dict]:
    """Per lazy-mode step that ran graphs or synced: the graphs, the recipes compiled, and why each new graph
    is new."""
    return [{"step": s.index, "graphs": len(s.graphs), "recipes_compiled": s.compiled, "host_syncs": len(s.syncs),
             "new_graphs": [{"graph": g.name, "ops": g.ops, "cut_by": g.cut_by, "source": g.source, "why": g.new}
                            for g in s.graphs if g.new]}
            for s in ledger.lazy_report()]


EAGER_OP = "eager op"  # what cuts an eager-mode op's one-op graph (``dispatch.py``)


def _lazy_recompiles(ledger) -> list[dict]:
    """Lazy graphs built again for a change of a constant, an argument or an input layout (the same ops as a
    graph seen before): the recompiles a steady state should not have (the docs' loop-constant pattern). An
    eager-mode op's one-op graph is not one: its first run at a layout is that layout's first compile."""
    return [{"kind": "lazy graph", "graph": g.name, "source": g.source, "cause": g.new}
            for step in ledger.lazy_report() for g in step.graphs
            if g.new.startswith("like ") and g.cut_by != EAGER_OP]


def op_layouts(device) -> dict[str, Any]:
    """Eager mode's first runs of an op at a layout (shapes, strides, dtypes, arguments), each lowered once to
    its own recipe, named by the op: ``{"total": N, "ops": {"aten.mm.default": 3, ...}}`` (most first)."""
    names = getattr(device, "op_names", {})
    ops = Counter(names.get(key[0], str(key[0])) for key in getattr(device, "estimates", {}))
    return {"total": sum(ops.values()), "ops": dict(ops.most_common())}


def _fallbacks(device) -> list[dict]:
    rows = [{"op": op, "dtypes": list(dtypes), "count": n} for (op, dtypes), n in device.fallbacks.items()]
    seen = {r["op"] for r in rows}
    rows += [{"op": op, "dtypes": fallback.dtypes(op), "count": n} for op, n in fallback.counts().items()
             if op not in seen]
    return sorted(rows, key=lambda r: -r["count"])


def _syncs(device) -> list[dict]:
    counts = Counter((what, source) for what, source, _ in device.syncs)
    cuts = Counter((what, source) for what, source, cut in device.syncs if cut)
    return [{"what": what, "source": source, "count": n, "cut_graphs": cuts[(what, source)]}
            for (what, source), n in counts.most_common()]
