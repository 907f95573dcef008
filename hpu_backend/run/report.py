"""The run's report: what the device saw (``hpu_backend.device.report()``) plus the run's own facts, rendered
as a few lines on stderr or written as JSON (one rank's, or every rank's under ``"ranks"``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .errors import RunError


def collect(script: str, exit_code: int, seconds: float) -> dict[str, Any]:
    """This process's report: the script, its exit code and wall time, its rank, and the device's report."""
    from .. import device

    out: dict[str, Any] = {"script": script, "exit_code": exit_code, "wall_s": round(seconds, 3)}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        out.update(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ["WORLD_SIZE"]))
    report = getattr(device, "report", None)
    out.update(report() if report is not None else device_facts())
    return out


def device_facts() -> dict[str, Any]:
    """The report's keys read from the device's state (its mode and settings, the lazy steps, the allocator,
    the fallbacks and syncs it counted), for a device without ``report()`` of its own."""
    from .. import device, metrics
    from ..gaudi import lazy_mode, memory

    dev = device.current()
    steps = [{"index": s.index, "graphs": len(s.graphs), "graphs_compiled": s.compiled,
              "new": [g.new for g in s.graphs if g.new]} for s in lazy_mode.lazy_report()]
    syncs: dict[tuple[str, str], int] = {}
    for what, source, _cut in (dev.syncs if dev else []):
        syncs[(what, source)] = syncs.get((what, source), 0) + 1
    return {"mode": dev.mode if dev else None, "target": dev.settings.target if dev else None, "steps": steps,
            "recompiles": [{"line": r.get("source", "?"), "cause": r.get("cause", r.get("reason", "?"))}
                           for r in metrics.recompiles()],
            "fallbacks": {f"{op} ({', '.join(dtypes)})": n for (op, dtypes), n in (dev.fallbacks if dev else {}).items()},
            "syncs": [{"kind": what, "line": line, "count": n} for (what, line), n in syncs.items()],
            "peak_memory_bytes": memory.max_memory_allocated(), "hbm_bytes": memory.capacity(),
            "device_time_per_step_s": None}


def finish(report: dict[str, Any], path: str | None) -> None:
    """Write ``report`` as JSON to ``path``, or render it on stderr when there is no path."""
    if path:
        write(report, path)
    else:
        sys.stdout.flush()
        print("\n".join(render(report)), file=sys.stderr, flush=True)


def write(report: dict[str, Any], path: str) -> None:
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    except OSError as e:
        raise RunError(f"--report {path}: {e.strerror}") from None


def read(path: str) -> dict[str, Any] | None:
    """A rank's report file, or None if the rank wrote none (it was stopped, or died)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def render(report: dict[str, Any]) -> list[str]:
    """The report as lines for people (the JSON has everything)."""
    who = f"rank {report['rank']}: " if "rank" in report else ""
    lines = [f"── hpu_backend: {who}{report.get('script', '?')} exited {report.get('exit_code')} after "
             f"{report.get('wall_s', 0):.1f} s; {report.get('mode', '?')} mode on {report.get('target', '?')}"]
    lines += [f"   {line}" for line in _body(report)]
    return lines


def _body(r: dict[str, Any]) -> list[str]:
    lines = [_steps(r.get("steps") or [])]
    lines.append(_listing("recompiles", r.get("recompiles") or [], lambda x: f"{x.get('line', '?')}: "
                          f"{x.get('cause', x.get('reason', '?'))}"))
    lines.append(_listing("CPU fallbacks", _pairs(r.get("fallbacks") or {}), lambda x: f"{x[0]} ×{x[1]}"))
    lines.append(_listing("host syncs", r.get("syncs") or [], lambda x: f"{x.get('line', '?')} "
                          f"({x.get('kind', 'read')}) ×{x.get('count', 1)}"))
    lines.append(_memory(r))
    est = r.get("device_time_per_step_s")
    lines.append("estimated device time per step: " + ("n/a" if est is None else f"{est * 1e3:.3f} ms"))
    return lines


def _pairs(value) -> list[tuple[str, int]]:
    return sorted(value.items(), key=lambda kv: -kv[1]) if isinstance(value, dict) else list(value)


def _steps(steps: list[dict]) -> str:
    if not steps:
        return "steps: none recorded"
    compiled = [int(s.get("graphs_compiled", 0)) for s in steps]
    steady = next((i for i in range(len(compiled)) if not any(compiled[i:])), None)
    tail = "compiles in every step" if steady is None else f"nothing compiled from step {steady} on"
    shown = ", ".join(map(str, compiled[:8])) + (", …" if len(compiled) > 8 else "")
    return f"steps: {len(steps)}; graphs compiled per step: {shown} ({tail})"


def _listing(title: str, items: list, fmt, limit: int = 5) -> str:
    if not items:
        return f"{title}: none"
    shown = "; ".join(fmt(x) for x in items[:limit])
    more = f"; … {len(items) - limit} more" if len(items) > limit else ""
    return f"{title}: {len(items)} — {shown}{more}"


def _memory(r: dict[str, Any]) -> str:
    peak, hbm = r.get("peak_memory_bytes"), r.get("hbm_bytes")
    if peak is None:
        return "peak device memory: n/a"
    share = f" ({100 * peak / hbm:.2f}% of {_size(hbm)} HBM)" if hbm else ""
    return f"peak device memory: {_size(peak)}{share}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
