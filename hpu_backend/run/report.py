"""The run's report: what the device saw (``hpu_backend.device.report()``) plus the run's own facts, rendered
as a few lines on stderr or written as JSON (one rank's, or every rank's under ``"ranks"``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..units import size
from .errors import RunError


def collect(script: str, exit_code: int, seconds: float) -> dict[str, Any]:
    """This process's report: the script, its exit code and wall time, its rank, and the device's report."""
    from .. import device

    out: dict[str, Any] = {"script": script, "exit_code": exit_code, "wall_s": round(seconds, 3)}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        out.update(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ["WORLD_SIZE"]))
    out.update(device.report())
    missed = _cache_missed()
    if missed:  # entries the cache held under another key: what differed (none: the field is left out)
        out["cache_missed"] = missed
    return out


def _cache_missed() -> dict[str, int]:
    from ..metrics import metric_global

    return dict(metric_global("cache_misses").stats())["Reasons"]


def trace(path: str) -> str:
    """Write this rank's step timeline to ``path`` (``-rankN`` added when there are several ranks); the file
    written, or the one-line reason it could not be."""
    from .. import device
    from ..timeline.trace import TraceError, rank_path

    world = int(os.environ.get("WORLD_SIZE", "1"))
    target = path if os.environ.get("HPU_BACKEND_RUN_RANK") else rank_path(path, int(os.environ.get("RANK", "0")), world)
    try:
        device.write_trace(target)
    except TraceError as e:
        return f"not written: {e}"
    return target


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
    lines = [_steps(r)]
    lines.append(_listing("recompiles", r.get("recompiles") or [], lambda x: f"{x.get('source') or x.get('graph') or '?'}: "
                          f"{x.get('cause', '?')}" + (f" ({x['change']})" if x.get("change") else "")))
    lines.append(_listing("CPU fallbacks", r.get("cpu_fallbacks") or [], lambda x: f"{x['op']}"
                          + (f" ({', '.join(x['dtypes'])})" if x.get("dtypes") else "") + f" ×{x['count']}"))
    lines.append(_listing("host syncs", r.get("host_syncs") or [], lambda x: f"{x['source']} {x['what']} ×{x['count']}"
                          + (f", {x['cut_graphs']} cut a graph" if x.get("cut_graphs") else "")))
    lines.append(_memory(r.get("memory") or {}))
    est = r.get("estimated_device_s_per_step")
    lines.append("estimated device time per step: " + ("n/a" if est is None else f"{est * 1e3:.3f} ms (estimate)"))
    if r.get("timeline"):
        lines.append(_timeline(r["timeline"]))
    if r.get("trace"):
        lines.append(f"trace: {r['trace']}")
    if r.get("cache_missed"):
        lines.append("cache misses of entries held under another key: "
                     + "; ".join(f"{why} ×{n}" for why, n in r["cache_missed"].items()))
    return lines


def _ms(seconds) -> str:
    return f"{1e3 * float(seconds or 0):.3f} ms"


def _timeline(t: dict[str, Any]) -> str:
    ms = _ms
    return (f"step timeline: {ms(t.get('step_s'))} per step (estimate{_which(t)}; host {ms(t.get('host_s'))}, of "
            f"which Python {ms(t.get('python_s'))} measured; device {ms(t.get('device_s'))}; syncs "
            f"{ms(t.get('sync_s'))}) — {t.get('bound') or '?'}-bound{_compiled(t.get('compiles') or {})}")


def _which(t: dict[str, Any]) -> str:
    """Which steps the steady step is: ", steps 4-9", or ", step 0 without its compiles" for a run of one step."""
    rows = t.get("steady_steps") or []
    if not rows:
        return ""
    span = f"step {rows[0]}" if len(rows) == 1 else f"steps {rows[0]}-{rows[-1]}"
    if not (t.get("compiles") or {}).get("left_out_of_steady"):
        return f", {span}"
    return f", {span} without {'its' if len(rows) == 1 else 'their'} compiles"


def _compiled(c: dict[str, Any]) -> str:
    """The run's compiles, apart from the step: measured on this host."""
    if not c.get("total_s"):
        return ""
    where = c.get("steps") or [0]
    first = f", step 0 {_ms(c.get('first_step_s'))}" if len(where) > 1 and where[0] == 0 else ""
    steps = f"step {where[0]}" if len(where) == 1 else f"steps {where[0]}-{where[-1]}"
    return f"; compiles {_ms(c['total_s'])} in {steps}{first} (measured, not in the step)"


def _steps(r: dict[str, Any]) -> str:
    """Lazy mode: recipes compiled per step, and from which step on nothing compiles; eager: ops per step."""
    graphs = r.get("lazy_graph_steps") or []
    if not graphs:
        ops = [s.get("ops", 0) for s in r.get("steps") or []]
        return f"steps: {len(ops)}; device ops per step: {_few(ops)}" if ops else "steps: none recorded"
    compiled = [int(s.get("recipes_compiled", 0)) for s in graphs]
    steady = next((i for i in range(len(compiled)) if not any(compiled[i:])), None)
    tail = ("one step" if len(compiled) == 1 else "compiles in every step" if steady is None
            else f"nothing compiled from step {graphs[steady]['step']} on")
    return (f"steps: {len(graphs)}; graphs per step: {_few([s.get('graphs', 0) for s in graphs])}; "
            f"recipes compiled per step: {_few(compiled)} ({tail})")


def _few(values: list, limit: int = 8) -> str:
    return ", ".join(map(str, values[:limit])) + (", …" if len(values) > limit else "")


def _listing(title: str, items: list, fmt, limit: int = 5) -> str:
    if not items:
        return f"{title}: none"
    shown = "; ".join(fmt(x) for x in items[:limit])
    more = f"; … {len(items) - limit} more" if len(items) > limit else ""
    return f"{title}: {len(items)} — {shown}{more}"


def _memory(r: dict[str, Any]) -> str:
    peak, hbm = r.get("peak_bytes"), r.get("hbm_bytes")
    if peak is None:
        return "peak device memory: n/a"
    share = f" ({100 * peak / hbm:.2f}% of {size(hbm)} HBM)" if hbm else ""
    return f"peak device memory: {size(peak)}{share}"
