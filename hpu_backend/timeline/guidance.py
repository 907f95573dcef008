"""``habana_perf_tool``'s job over a trace: the limiting resource with its share of the step, then advice, each
with the gain the trace's own numbers give.

The trace is streamed (``trace.events``): per row, the busy time; per step (our traces carry each step's parts
in its span's args), host, device and what syncs serialize. A trace of the same layout from elsewhere (a
``/device:HPU`` process with engine rows) is read by its rows alone: the host's busy time is the union of its
spans, the device's the union of its engines', the step the trace's length. Gains come from the parts:
a step takes max(host, device) + serialized syncs, and each remedy changes one part.

Memory stays bounded whatever the trace's size: steps are summed as they stream by (never kept), and a trace
naming more rows or sync sources than any step timeline has is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .host import HOST
from .trace import TraceError, events

ENGINES = ("MME", "TPC", "DMA", "Network")
STEP_KEYS = ("time_s", "host_s", "dispatch_s", "input_s", "device_s", "sync_s", "compile_s")
MAX_ROWS = 10_000  # rows (pid, tid) and sync sources: a step timeline has tens; more is not a trace we read
SKIP = 2  # the first steps are warm-up (as model.steady)


@dataclass
class Parts:
    """Mean per step, seconds: host busy and its pieces, device engines, syncs."""

    steps: int = 0
    step_s: float = 0.0
    host_s: float = 0.0
    dispatch_s: float = 0.0
    input_s: float = 0.0
    staging_s: float = 0.0
    copy_wait_s: float = 0.0
    launches: float = 0.0
    device_s: float = 0.0
    sync_s: float = 0.0
    compile_s: float = 0.0  # left out of the step and the host (measured lowering)
    engines: dict = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    sync_lines: dict = field(default_factory=dict)  # source -> host-read count


@dataclass
class Advice:
    what: str
    gain_s: float | None  # per step; None where the trace cannot tell
    detail: str


def read(path: str) -> Parts:
    """The trace's mean step parts (TraceError: one line)."""
    rows = _Rows(path)
    for e in events(path):
        rows.add(e)
    return rows.parts(path)


class _Rows:
    def __init__(self, path: str):
        self.path = path
        self.names: dict = {}  # (pid, tid) -> row name
        self.device_pids: set = set()
        self.busy: dict = {}  # row -> seconds
        self.steps = _StepSums(path)
        self.launches = 0
        self.staging = 0.0
        self.lines: dict = {}
        self.begin, self.end = float("inf"), 0.0

    def add(self, e: dict) -> None:
        if e.get("ph") == "M":
            self._meta(e)
        elif e.get("ph") == "X":
            self._span(e)

    def _meta(self, e: dict) -> None:
        name = str((e.get("args") or {}).get("name", ""))
        if e.get("name") == "process_name" and name.startswith("/device:HPU"):
            self.device_pids.add(e.get("pid"))
        elif e.get("name") == "thread_name":
            self.names[(e.get("pid"), e.get("tid"))] = name
            _bounded(self.names, "rows", self.path)

    def _span(self, e: dict) -> None:
        row = self.names.get((e.get("pid"), e.get("tid")), str(e.get("cat", "")))
        if e.get("pid") in self.device_pids:
            row = "device:" + row
        args = e.get("args") or {}
        dur = float(e.get("dur") or 0) / 1e6
        if row == "Steps":
            self.steps.add(args)
            return
        start = float(e.get("ts") or 0) / 1e6
        self.begin, self.end = min(self.begin, start), max(self.end, start + dur)
        self.busy[row] = self.busy.get(row, 0.0) + dur
        if row == "Launch":
            self.launches += 1
        if str(e.get("name", "")).startswith("stage "):
            self.staging += dur
        if row == "Sync" and str(e.get("name", "")).startswith("read back") and args.get("source"):
            source = str(args["source"])[:200]
            self.lines[source] = self.lines.get(source, 0) + 1
            _bounded(self.lines, "sync sources", self.path)
        _bounded(self.busy, "rows", self.path)

    def parts(self, path: str) -> Parts:
        if not self.device_pids:
            raise TraceError(f"{path}: a trace, but with no device rows (no /device:HPU process)")
        n = self.steps.count or 1
        p = Parts(steps=self.steps.count, launches=self.launches / n, staging_s=self.staging / n,
                  sync_lines={k: v / n for k, v in self.lines.items()})
        p.engines = {k: self.busy.get("device:" + k, 0.0) / n for k in ENGINES}
        if self.steps.count:
            _from_steps(p, self.steps.steady())
        else:
            _from_rows(p, self.busy, max(self.end - self.begin, 0.0))
        return p


def _bounded(table: dict, what: str, path: str) -> None:
    if len(table) > MAX_ROWS:
        raise TraceError(f"{path}: not a step timeline (more than {MAX_ROWS} {what})")


class _StepSums:
    """The step spans' numbers, summed as they stream by: over every step, over the steps past the warm-up, and
    over the steps past the warm-up and the last step that compiled (``steady`` of a list, in O(1) memory)."""

    def __init__(self, path: str):
        self.path, self.count = path, 0
        self.all, self.warm, self.after = {}, {}, {}

    def add(self, args: dict) -> None:
        numbers = _step_numbers(args)
        if numbers is None:
            raise TraceError(f"{self.path}: not a trace (a step's args are not finite numbers: {str(args)[:80]})")
        index, self.count = self.count, self.count + 1
        _add(self.all, numbers)
        if numbers["compile_s"] > 0:
            self.after = {}
        elif index >= SKIP:
            _add(self.after, numbers)
        if index >= SKIP:
            _add(self.warm, numbers)

    def steady(self) -> dict:
        """Mean of each number over the steady steps."""
        sums = next(s for s in (self.after, self.warm, self.all) if s)
        n = sums.pop("_n")
        return {k: v / n for k, v in sums.items()}


def _add(sums: dict, numbers: dict) -> None:
    for k, v in numbers.items():
        sums[k] = sums.get(k, 0.0) + v
    sums["_n"] = sums.get("_n", 0) + 1


def _step_numbers(args: dict) -> dict | None:
    """The numbers a step span carries (engines and the copy wait flattened); None if one is not a finite
    number."""
    engines, waits = args.get("engines") or {}, args.get("waits") or {}
    if not isinstance(engines, dict) or not isinstance(waits, dict):
        return None
    raw = {**{k: args.get(k) for k in STEP_KEYS}, "copy_wait": waits.get("copy"),
           **{"engine:" + k: engines.get(k) for k in ENGINES}}
    out = {}
    for k, v in raw.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return None
        out[k] = float(v or 0)
    return out


def _from_steps(p: Parts, mean: dict) -> None:
    """The parts from the steady steps' mean numbers (``_StepSums.steady``)."""
    # Compiles are not the steady state (a warm-up's or an analysis's trace compiles in every step): left out.
    p.compile_s = mean["compile_s"]
    p.step_s, p.host_s = mean["time_s"] - p.compile_s, mean["host_s"] - p.compile_s
    p.dispatch_s = mean["dispatch_s"]
    p.input_s, p.device_s, p.sync_s = mean["input_s"], mean["device_s"], mean["sync_s"]
    p.copy_wait_s = mean["copy_wait"]
    p.engines = {k: mean["engine:" + k] for k in ENGINES}


def _from_rows(p: Parts, busy: dict, wall: float) -> None:
    p.step_s = wall
    p.host_s = sum(v for k, v in busy.items() if not k.startswith("device:") and k != "Sync")
    p.device_s = min(busy.get("device:Recipe", sum(p.engines.values())), wall)
    p.sync_s = max(wall - max(p.host_s, p.device_s), 0.0)


def limiting(p: Parts) -> tuple[str, float]:
    """The resource with the largest share of the step: host, an engine, or syncs."""
    shares = {"host": p.host_s, **p.engines, "syncs": p.sync_s}
    name = max(shares, key=shares.get)
    return name, (shares[name] / p.step_s if p.step_s else 0.0)


def advise(p: Parts) -> list[Advice]:
    """Each remedy with the step time it would save (largest first)."""
    def new(host: float, device: float, sync: float = p.sync_s) -> float:
        return max(host, device) + sync

    now = new(p.host_s, p.device_s)
    found = [
        Advice("fewer syncs", now - new(p.host_s, p.device_s, 0.0),
               "host reads (.item(), .cpu(), print) drain the device every step: read every N steps or log "
               "device tensors" + _lines(p)),
        Advice("HPU Graphs", now - new(p.host_s - p.dispatch_s + p.launches * HOST.graph_replay_s, p.device_s),
               "the bridge's per-op dispatch and launches are host time: wrap the model in "
               "htorch.hpu.wrap_in_hpu_graph (inference) or capture the step"),
        Advice("more loader workers", now - new(p.host_s - p.input_s, p.device_s),
               "the host waits for the next batch before its first copy: raise DataLoader num_workers"),
        Advice("pinned memory", now - new(p.host_s - p.staging_s, p.device_s, max(p.sync_s - p.copy_wait_s, 0.0)),
               "pageable copies are staged by the host and block it: DataLoader(pin_memory=True) and "
               ".to('hpu', non_blocking=True)"),
    ]
    if p.host_s > p.device_s > 0:
        per_sample_now, per_sample_2x = now, new(p.host_s, 2 * p.device_s) / 2
        found.append(Advice("increase the batch size", per_sample_now - per_sample_2x,
                            "the device idles while the host works: twice the batch costs the host about the "
                            "same (gain per step of today's batch size, at twice the batch)"))
    if limiting(p)[0] == "TPC":  # (a training plan's trace has no MME/TPC split: only its optimizer is on TPC)
        found.append(Advice("MME/TPC usage", None, "TPC work exceeds MME work on a device-bound step: fuse "
                            "elementwise ops (torch.compile), bf16 autocast, FusedSDPA"))
    return sorted([a for a in found if a.gain_s is None or a.gain_s > 0],
                  key=lambda a: -(a.gain_s if a.gain_s is not None else -1))


def _lines(p: Parts) -> str:
    top = sorted(p.sync_lines.items(), key=lambda kv: -kv[1])[:3]
    return (" (at " + ", ".join(f"{src} ×{n:.2g}/step" for src, n in top) + ")") if top else ""


def report(path: str) -> dict:
    """What ``hpurecipe perf-tool`` prints, as data."""
    p = read(path)
    name, share = limiting(p)
    return {"trace": path, "steps": p.steps, "step_s": p.step_s, "compile_s": p.compile_s, "host_s": p.host_s,
            "device_s": p.device_s,
            "sync_s": p.sync_s, "engines": p.engines, "limiting": name, "share": share,
            "advice": [{"what": a.what, "gain_s": a.gain_s, "detail": a.detail} for a in advise(p)],
            "estimate": True}
