"""The step timeline: what a run records (host Python, dispatch, launches, copies, syncs, step ends), scheduled as
an asynchronous Gaudi runs it, with each step's time, its parts and what bounds it.

The host is one thread. It runs the user's Python (measured) and the bridge's dispatch (``host.HostCosts``),
enqueues recipes and runs ahead of the device until it needs a value. The device has in-order engines: the
compute stream (each recipe's clusters, the MME and TPC work from the recipe's cost model), DMA (host↔device
copies over the card's PCIe link) and the network (the recipe's collectives). Rules:

- a recipe starts when the host has enqueued it, the compute stream is free and the copies before it landed;
- a host→device copy from pageable memory is first staged by the host (a memcpy), and the host waits for the
  copy (a pageable copy is synchronous whatever ``non_blocking`` says); from pinned memory the DMA engine reads
  it directly, and ``non_blocking=True`` lets the host go on;
- a sync (``.item()``, ``.cpu()``, printing) waits until every engine drained, then reads back;
- ``mark_step`` ends a step; the host runs at most one step ahead of the device (the bridge's queue), so at a
  step end it waits for the device to finish the step before the last.

A step's time is from the end of the one before (the first: from the script's first device call; its Python
before that is setup) to the moment both host and device are done with it. Its parts
are host busy time, device busy time and what syncs serialize (the step's time beyond the larger of the two);
the largest part bounds the step: ``host``, ``device`` or ``sync``.

Events are plain tuples, cheap to record:
``("py", s)``, ``("op", "eager"|"lazy")``, ``("launch", kind, name, rid, Cost, compile_s)`` (kind ``lazy``,
``eager``, ``compiled`` or ``replay``), ``("copy", nbytes, to_device, pinned, non_blocking, source)``,
``("sync", what, source)``, ``("comm", kind, nbytes, group)`` (a collective issued outside every recipe, such as
DDP's gradient all-reduces: on the network once the compute stream has produced its input), ``("step",)`` or
``("step", simulator_s, clock_s)`` (a recorded step end: the simulator's own time in the step and the host's clock,
both measured, so that a step's estimate stands next to what it took on this host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..targets import COLLECTIVES, device as device_spec, fabric
from .host import HOST, HostCosts

HOST_ROWS = ("Steps", "Host ops", "Launch", "Compile", "Sync")
DEVICE_ROWS = ("Recipe", "MME", "TPC", "DMA", "Network")


class Cost(NamedTuple):
    """A recipe's estimated work: per cluster (mme_s, tpc_s, hbm_s, launch_s, time_s), its collectives
    (kind, seconds, cluster index), the CPU-fallback and fallback-transfer seconds."""

    clusters: tuple = ()
    comms: tuple = ()
    cpu_s: float = 0.0
    transfer_s: float = 0.0

    @property
    def device_s(self) -> float:
        return sum(c[4] for c in self.clusters)


def cost_of(facts: dict) -> Cost:
    """The ``Cost`` of a recipe from its ``facts["cost"]`` (the estimate_cost pass's output)."""
    cost = facts.get("cost") or {}
    rows = cost.get("clusters") or []
    index = {r.get("id"): i for i, r in enumerate(rows)}
    clusters = tuple((float(r.get("mme_s", 0)), float(r.get("tpc_s", 0)), float(r.get("hbm_s", 0)),
                      float(r.get("launch_s", 0)), float(r.get("time_s", 0))) for r in rows)
    comms = tuple((str(c.get("kind", "")), float(c.get("time_s", 0)), index.get(c.get("cluster"), 0))
                  for c in cost.get("collectives") or [])
    return Cost(clusters, comms, float(cost.get("cpu_s") or 0), float(cost.get("transfer_s") or 0))


class Span(NamedTuple):
    process: str  # "host" | "device"
    row: str
    name: str
    start_s: float
    dur_s: float
    args: dict


@dataclass
class StepTime:
    """One step on the timeline (seconds)."""

    step: int
    start_s: float = 0.0
    end_s: float = 0.0
    host_s: float = 0.0  # busy: Python, dispatch, launches, compiles, staging copies, read-backs
    python_s: float = 0.0  # of which the user's Python (measured)
    input_s: float = 0.0  # of which the Python before the step's first host→device copy (the input loader)
    dispatch_s: float = 0.0  # of which per-op dispatch and launches (what HPU Graphs replace)
    compile_s: float = 0.0  # of which first launches of recipes (lowering, measured)
    setup_s: float = 0.0  # before the step: the script's Python before its first device call (not in the step)
    device_s: float = 0.0  # busy: the compute stream and DMA
    engines: dict = field(default_factory=lambda: {"MME": 0.0, "TPC": 0.0, "DMA": 0.0, "Network": 0.0})
    waits: dict = field(default_factory=lambda: {"sync": 0.0, "copy": 0.0, "queue": 0.0})
    syncs: list = field(default_factory=list)  # (what, source, waited seconds)
    wall_s: float | None = None  # measured on this host: from the step end before to this one
    simulator_s: float = 0.0  # measured: of that, the simulator's own work (lowering, dispatch, host kernels)
    copies: list = field(default_factory=list)  # (nbytes, pinned, non_blocking, seconds on DMA, source)

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def serial_s(self) -> float:
        """What syncs serialize: the step's time beyond the larger of host and device busy time, at most the time
        the host waited on reads and blocking copies (a step's device work after its last launch is not a sync)."""
        beyond = max(self.time_s - max(self.host_s, self.device_s), 0.0)
        return min(beyond, self.waits["sync"] + self.waits["copy"])

    @property
    def bound(self) -> str:
        parts = {"host": self.host_s, "device": self.device_s, "sync": self.serial_s}
        return max(parts, key=parts.get)

    def summary(self) -> dict:
        return {"step": self.step, "time_s": self.time_s, "host_s": self.host_s, "python_s": self.python_s,
                "input_s": self.input_s, "dispatch_s": self.dispatch_s, "compile_s": self.compile_s,
                "setup_s": self.setup_s, "device_s": self.device_s,
                "sync_s": self.serial_s, "engines": dict(self.engines), "waits": dict(self.waits),
                "bound": self.bound, "estimate": True, "measured_wall_s": self.wall_s,
                "measured_simulator_s": self.simulator_s}


class Link(NamedTuple):
    """The card's host link: usable bytes per second one way, and the setup latency per copy."""

    bytes_per_s: float
    latency_s: float

    @classmethod
    def of(cls, target: str) -> "Link":
        dev = device_spec(target)
        return cls(dev.host_bytes_per_s * dev.efficiency.host, dev.host_latency_s)


class Schedule:
    """One pass over a run's events: the clock of the host and of each engine, the steps, and (optionally) the
    spans a trace shows."""

    def __init__(self, target: str = "gaudi2", host: HostCosts = HOST, spans: bool = False):
        self.host, self.link, self.keep = host, Link.of(target), spans
        self.net = fabric(target)
        self.t = 0.0  # the host thread
        self.free = {"compute": 0.0, "DMA": 0.0, "Network": 0.0}
        self.landed = 0.0  # when the last host→device copy is on the device
        self.prev_device_end = 0.0  # when the device finished the previous step's work
        self.steps: list[StepTime] = [StepTime(0)]
        self.spans: list[Span] = []
        self._open: list | None = None  # the host-ops span being extended: [start, ops, python_s, dispatch_s]
        self._copied = False  # a host→device copy happened in this step (ends the input phase)
        self._started = False  # the first device call was scheduled
        self._clock_at: float | None = None  # the host's clock at the last recorded step end

    def run(self, events: Iterable[tuple]) -> "Schedule":
        for e in events:
            if e[0] == "py" and not self._started:
                self._setup(e[1])
                continue
            self._started = True
            getattr(self, "_" + e[0])(*e[1:])
        return self

    @property
    def step(self) -> StepTime:
        return self.steps[-1]

    def drained(self) -> float:
        return max(self.free.values())

    # -- host ---------------------------------------------------------------------------------------------

    def _setup(self, seconds: float) -> None:
        """The script's Python before its first device call (imports, data sets, the model built): on the
        trace, but before the first step starts."""
        if self.keep and seconds > 0:
            self.spans.append(Span("host", "Host ops", "setup (Python before the first device call)", self.t,
                                   seconds, {"python_s": seconds, "measured": "python_s"}))
        self.t += seconds
        self.step.start_s = self.t
        self.step.setup_s += seconds

    def _py(self, seconds: float) -> None:
        self._host_ops(seconds, 0.0, 0)
        self.step.python_s += seconds
        if not self._copied:
            self.step.input_s += seconds

    def _op(self, mode: str) -> None:
        cost = self.host.eager_op_s if mode == "eager" else self.host.lazy_op_s
        self._host_ops(0.0, cost, 1)
        self.step.dispatch_s += cost

    def _host_ops(self, python_s: float, dispatch_s: float, ops: int) -> None:
        if self._open is None:
            self._open = [self.t, 0, 0.0, 0.0]
        self._open[1] += ops
        self._open[2] += python_s
        self._open[3] += dispatch_s
        self.t += python_s + dispatch_s
        self.step.host_s += python_s + dispatch_s

    def _close_ops(self) -> None:
        if self._open is not None and self.keep:
            start, ops, py, disp = self._open
            self.spans.append(Span("host", "Host ops", f"{ops} ops" if ops else "python", start, self.t - start,
                                   {"ops": ops, "python_s": py, "measured": "python_s",
                                    "dispatch_s": disp, "estimate": "dispatch_s (bridge constants)"}))
        self._open = None

    def _busy(self, row: str, name: str, seconds: float, args: dict) -> None:
        """The host busy for ``seconds`` on ``row``."""
        self._close_ops()
        if self.keep and seconds > 0:
            self.spans.append(Span("host", row, name, self.t, seconds, args))
        self.t += seconds
        self.step.host_s += seconds

    def _wait(self, until: float, cause: str, name: str, args: dict) -> float:
        """The host stalls until ``until``; the seconds waited."""
        self._close_ops()
        waited = max(until - self.t, 0.0)
        if waited > 0:
            if self.keep:
                self.spans.append(Span("host", "Sync", name, self.t, waited, {**args, "wait": cause, "estimate": True}))
            self.step.waits[cause] += waited
            self.t = until
        return waited

    # -- launches -------------------------------------------------------------------------------------------

    def _launch(self, kind: str, name: str, rid: int, cost: Cost, compile_s: float = 0.0) -> None:
        if compile_s > 0:
            self.step.compile_s += compile_s
            self._busy("Compile", f"compile {name}", compile_s,
                       {"recipe": name, "recipe_id": rid, "measured": "lowering on this host (not Gaudi's graph "
                        "compiler)"})
        host_s = {"lazy": self.host.lazy_graph_s + self.host.recipe_launch_s, "compiled": self.host.recipe_launch_s,
                  "replay": self.host.graph_replay_s}.get(kind, 0.0)
        if host_s:
            self.step.dispatch_s += host_s
            self._busy("Launch", f"launch {name}", host_s, {"recipe": name, "recipe_id": rid, "kind": kind,
                                                            "estimate": True})
        if cost.cpu_s:
            self._busy("Host ops", f"CPU fallback in {name}", cost.cpu_s, {"recipe": name, "estimate": True})
        start = max(self.t, self.free["compute"], self.landed)
        end = self._clusters(name, rid, kind, cost, start)
        self.free["compute"] = end
        if cost.transfer_s:
            self._dma(max(end, self.free["DMA"]), cost.transfer_s, f"fallback copies of {name}", {"recipe": name})

    def _clusters(self, name: str, rid: int, kind: str, cost: Cost, start: float) -> float:
        t, engines = start, self.step.engines
        for i, (mme, tpc, hbm, launch, time_s) in enumerate(cost.clusters):
            work = max(mme, tpc, 0.0)
            for row, busy in (("MME", mme), ("TPC", tpc)):
                if busy > 0:
                    span = (time_s - launch) * busy / work  # the bound engine spans the cluster, the other its share
                    engines[row] += span
                    self._device(row, name, t + launch, span, {"recipe": name, "recipe_id": rid, "cluster": i,
                                                               "busy_s": busy, "hbm_s": hbm})
            for kind_c, seconds, at in cost.comms:
                if at == i:
                    begin = max(t + launch, self.free["Network"])
                    self.free["Network"] = begin + seconds
                    engines["Network"] += seconds
                    self._device("Network", f"{kind_c} in {name}", begin, seconds, {"recipe": name, "recipe_id": rid})
            t += time_s
        self.step.device_s += t - start
        self._device("Recipe", name, start, t - start, {"recipe": name, "recipe_id": rid, "launched_by": kind,
                                                       "clusters": len(cost.clusters)})
        return t

    def _device(self, row: str, name: str, start: float, dur: float, args: dict) -> None:
        if self.keep and dur > 0:
            self.spans.append(Span("device", row, name, start, dur, {**args, "estimate": True}))

    def _dma(self, start: float, seconds: float, name: str, args: dict) -> float:
        self.free["DMA"] = start + seconds
        self.step.engines["DMA"] += seconds
        self.step.device_s += seconds
        self._device("DMA", name, start, seconds, args)
        return start + seconds

    def _comm(self, kind: str, nbytes: int, group: int) -> None:
        known = kind if kind in COLLECTIVES else "all_gather"  # broadcast and the rest: one pass of the bytes
        seconds = self.net.collective_s(known, nbytes, min(group, self.net.cards_per_server))
        begin = max(self.t, self.free["compute"], self.free["Network"])
        self.free["Network"] = begin + seconds
        self.step.engines["Network"] += seconds
        self.step.device_s += seconds
        self._device("Network", f"{kind} ({nbytes} B)", begin, seconds, {"bytes": nbytes, "group": group})

    # -- copies and syncs ---------------------------------------------------------------------------------

    def _copy(self, nbytes: int, to_device: bool, pinned: bool, non_blocking: bool, source: str) -> None:
        memory = "pinned" if pinned else "pageable"
        if not pinned:  # staged through the driver's pinned buffer by a host memcpy
            self._busy("Host ops", f"stage {nbytes} B (pageable)", nbytes / self.host.staging_bytes_per_s,
                       {"bytes": nbytes, "source": source, "estimate": True})
        seconds = self.link.latency_s + nbytes / self.link.bytes_per_s
        after = self.t if to_device else max(self.t, self.free["compute"])
        end = self._dma(max(after, self.free["DMA"]), seconds, f"{'H2D' if to_device else 'D2H'} {memory} copy",
                        {"bytes": nbytes, "memory": memory, "non_blocking": non_blocking, "source": source})
        self.step.copies.append((nbytes, pinned, non_blocking, seconds, source))
        if to_device:
            self.landed = max(self.landed, end)
            self._copied = True
        if not (pinned and non_blocking):
            self._wait(end, "copy", f"copy wait at {source}", {"source": source, "memory": memory})

    def _sync(self, what: str, source: str) -> None:
        waited = self._wait(self.drained(), "sync", f"{what} at {source}", {"what": what, "source": source})
        self._busy("Sync", f"read back ({what})", self.host.sync_s, {"source": source, "estimate": True})
        self.step.syncs.append((what, source, waited))

    def _step(self, simulator_s: float = 0.0, clock_s: float | None = None) -> None:
        if clock_s is not None:
            self.step.simulator_s = simulator_s
            if self._clock_at is not None:
                self.step.wall_s = clock_s - self._clock_at
            self._clock_at = clock_s
        self._wait(self.prev_device_end, "queue", "device queue full (one step ahead)", {})
        self._close_ops()
        step = self.step
        step.end_s = max(self.t, self.drained())
        self.prev_device_end = self.drained()
        if self.keep:
            self.spans.append(Span("host", "Steps", f"step {step.step}", step.start_s, step.time_s, step.summary()))
        self.steps.append(StepTime(step.step + 1, start_s=step.end_s))
        self._copied = False

    def finish(self) -> list[StepTime]:
        """The steps, the one under way ended here if it ran anything on the device (a tail of host reads after
        the last ``mark_step`` is not a step)."""
        if self.step.device_s:
            self._step()
        return self.steps[:-1]


def steady(steps: list[StepTime], skip: int = 2) -> list[StepTime]:
    """The steady state: the steps after the last one that compiled, and after the first ``skip``; when that
    leaves none, the steps after the first ``skip``, else all."""
    last = max((i for i, s in enumerate(steps) if s.compile_s > 0), default=-1)
    return steps[max(last + 1, skip):] or steps[skip:] or steps

