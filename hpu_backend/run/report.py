"""The run's report: what the device saw (``hpu_backend.device.report()``) plus the run's own facts, rendered
as a few lines on stderr or written as JSON. The JSON has one shape for any number of ranks:
``{"world_size": N, "ranks": [one report per rank]}``, each with its ``rank``."""

from __future__ import annotations

import json
import sys
from typing import Any

from .. import envs
from ..units import size
from .errors import RunError


def collect(script: str, exit_code: int, seconds: float) -> dict[str, Any]:
    """This process's report: the script, its exit code and wall time, its rank, and the device's report."""
    from .. import device

    out: dict[str, Any] = {"script": script, "exit_code": exit_code, "wall_s": round(seconds, 3),
                           "rank": envs.get("RANK"), "world_size": envs.get("WORLD_SIZE")}
    out.update(device.report())
    out["recipe_cache"] = _recipe_cache()
    missed = _cache_missed()
    if missed:  # entries the cache held under another key: what differed (none: the field is left out)
        out["cache_missed"] = missed
    return out


def _recipe_cache() -> dict[str, int]:
    """What the run's graphs took from the recipe cache and what they compiled: recipes found (``hits``) or
    lowered (``compiled``: lowerings of any kind, HPU-graph captures included), and Dynamo graphs whose stored
    program was found (``program_hits``) or traced (``program_misses``)."""
    from ..metrics import metric_global

    cache, compiles = dict(metric_global("recipe_cache").stats()), dict(metric_global("graph_compilation").stats())
    return {"hits": cache["TotalHit"], "compiled": compiles["TotalNumber"], "program_hits": cache["ProgramHit"],
            "program_misses": cache["ProgramMiss"]}


def _cache_missed() -> dict[str, int]:
    from ..metrics import metric_global

    return dict(metric_global("cache_misses").stats())["Reasons"]


def trace(path: str) -> str:
    """Write this rank's step timeline to ``path`` (``-rankN`` added when there are several ranks); the file
    written, or the one-line reason it could not be."""
    from .. import device
    from ..timeline.trace import TraceError, rank_path

    target = path if envs.get("HPU_BACKEND_RUN_RANK") else rank_path(path, envs.get("RANK"), envs.get("WORLD_SIZE"))
    try:
        device.write_trace(target)
    except TraceError as e:
        return f"not written: {e}"
    return target


def finish(report: dict[str, Any], path: str | None) -> None:
    """Write ``report`` as JSON to ``path``, or render it on stderr when there is no path. A rank the launcher
    started writes its own report for the launcher to gather; a run of one process writes the gathered shape."""
    if path:
        write(report if envs.get("HPU_BACKEND_RUN_RANK") else gathered([report]), path)
    else:
        sys.stdout.flush()
        print("\n".join(render(report)), file=sys.stderr, flush=True)


def write(report: dict[str, Any], path: str) -> None:
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    except OSError as e:
        raise RunError(f"--report {path}: {e.strerror}") from None


def gathered(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``--report`` file: every rank's report, in rank order, under ``"ranks"``."""
    return {"world_size": len(per_rank), "ranks": per_rank}


def read(path: str) -> dict[str, Any] | None:
    """A rank's report file, or None if the rank wrote none (it was stopped, or died)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def render(report: dict[str, Any]) -> list[str]:
    """The report as lines for people (the JSON has everything); one line for a run with no device work."""
    who = f"rank {report['rank']}: " if report.get("world_size", 1) > 1 and "rank" in report else ""
    head = (f"── hpu_backend: {who}{report.get('script', '?')} exited {report.get('exit_code')} after "
            f"{report.get('wall_s', 0):.1f} s; {report.get('mode', '?')} mode on {report.get('target', '?')}"
            + (f", Gaudi software {report['release']} (simulated)" if report.get("release") else ""))
    if not _device_work(report):
        return [head + "; no device work"]
    return [head] + [f"   {line}" for line in _body(report)]


def _device_work(r: dict[str, Any]) -> bool:
    """Whether the script did anything on the device: ops, graphs, syncs, fallbacks, compiles or memory."""
    return bool(r.get("steps") or r.get("lazy_graph_steps") or r.get("recompiles") or r.get("cpu_fallbacks")
                or r.get("host_syncs") or (r.get("memory") or {}).get("peak_bytes")
                or ((r.get("timeline") or {}).get("compiles") or {}).get("total_s"))


RECOMPILES_SHOWN = 3  # the first causes listed; the JSON has them all
CHANGE_CHARS = 60  # a changed value as the line shows it (a list of floats is cut, not printed whole)


def _body(r: dict[str, Any]) -> list[str]:
    lines = [_steps(r)]
    if (r.get("op_layouts_compiled") or {}).get("total"):
        lines.append(_op_layouts(r["op_layouts_compiled"]))
    lines.append(_listing("recompiles", r.get("recompiles") or [], _recompile, limit=RECOMPILES_SHOWN))
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
    if any((r.get("recipe_cache") or {}).values()):
        c = r["recipe_cache"]
        lines.append(f"recipe cache: {c['hits']} recipes found, {c['compiled']} compiled; programs: "
                     f"{c['program_hits']} found, {c['program_misses']} traced")
    if r.get("cache_missed"):
        lines.append("cache misses of entries held under another key: "
                     + "; ".join(f"{why} ×{n}" for why, n in r["cache_missed"].items()))
    return lines


def _recompile(x: dict[str, Any]) -> str:
    """One recompile, bounded: where, its cause, and what changed cut to ``CHANGE_CHARS``."""
    change = str(x.get("change") or "")
    if len(change) > CHANGE_CHARS:
        change = change[:CHANGE_CHARS - 1] + "…"
    return f"{x.get('source') or x.get('graph') or '?'}: {_clip(str(x.get('cause', '?')))}" + (
        f" ({change})" if change else "")


def _clip(text: str) -> str:
    return text if len(text) <= 2 * CHANGE_CHARS else text[:2 * CHANGE_CHARS - 1] + "…"


def _op_layouts(layouts: dict[str, Any]) -> str:
    """Eager mode's first compiles, one per op and layout: not recompiles (nothing compiled twice)."""
    ops = list((layouts.get("ops") or {}).items())
    shown = ", ".join(f"{op.removeprefix('aten.').removesuffix('.default')} ×{n}" for op, n in ops[:5])
    more = f", … {len(ops) - 5} more ops" if len(ops) > 5 else ""
    return (f"eager op layouts: {layouts['total']} first runs (one recipe per op and shape/dtype, not recompiles)"
            f" — {shown}{more}")


def _ms(seconds) -> str:
    return f"{1e3 * float(seconds or 0):.3f} ms"


def _timeline(t: dict[str, Any]) -> str:
    ms = _ms
    return (f"step timeline: {ms(t.get('step_s'))} per step (estimate{_which(t)}; host {ms(t.get('host_s'))}, of "
            f"which Python {ms(t.get('python_s'))} measured; device {ms(t.get('device_s'))}; syncs "
            f"{ms(t.get('sync_s'))}) — {t.get('bound') or '?'}-bound{_compiled(t.get('compiles') or {})}"
            + _here(t.get("measured")))


def _here(m: dict[str, Any] | None) -> str:
    """What a steady step took on this host, and where that went (measured)."""
    if not m:
        return ""
    return (f"; on this host {_ms(m['wall_s'])} per step (measured: the script and torch {_ms(m['python_s'])}, "
            f"the simulator {_ms(m['simulator_s'])})")


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
    """Lazy mode: graphs and recipes compiled per step; eager: ops per step. Either way, from which step on nothing
    compiled at all (lazy graphs, torch.compile graphs and eager op layouts alike, from the timeline's compiles)."""
    graphs = r.get("lazy_graph_steps") or []
    compiling = set(((r.get("timeline") or {}).get("compiles") or {}).get("steps") or [])
    if not graphs:
        rows = r.get("steps") or []
        if not rows:
            return "steps: none recorded"
        ops, last = [s.get("ops", 0) for s in rows], max(s.get("step", i) for i, s in enumerate(rows))
        return f"steps: {len(ops)}; device ops per step: {_few(ops)}{_settled(last + 1, compiling)}"
    compiled = [int(s.get("recipes_compiled", 0)) for s in graphs]
    compiling |= {s["step"] for s, n in zip(graphs, compiled) if n}
    return (f"steps: {len(graphs)}; graphs per step: {_few([s.get('graphs', 0) for s in graphs])}; "
            f"lazy-graph recipes compiled per step: {_few(compiled)}"
            f"{_settled(max(s['step'] for s in graphs) + 1, compiling)}")


def _settled(steps: int, compiling: set) -> str:
    """" (nothing compiled from step N on)" when at least two steps at the end compiled nothing (one quiet last step
    is no steady state); else up to which step the run compiled."""
    if steps <= 1:
        return ""
    if not compiling:
        return " (nothing compiled)"
    last = max(compiling)
    if last >= steps - 2:
        return f" (compiling up to step {last} of steps 0-{steps - 1})"
    return f" (nothing compiled from step {last + 1} on)"


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
