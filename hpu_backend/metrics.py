"""Metrics with the Gaudi bridge's API (``habana_frameworks.torch.hpu.metrics``).

``metric_global(name).stats()`` gives ``[(tag, value), ...]`` since process start;
``with metric_localcontext(name) as m: ...`` gives the same for a region. Names and tags:
``graph_compilation`` (TotalNumber, TotalTime and AvgTime in microseconds, Reasons, RecompileCauses: the
class of each recompile's failed guard; ``recompiles()`` lists them in full, with guard, value and source line),
``recipe_cache`` (TotalHit, TotalMiss, RecipeHit, RecipeMiss; ProgramHit, ProgramMiss count Dynamo
graphs served from a stored program, skipping AOTAutograd, or traced), ``cache_misses`` (TotalNumber,
Reasons: misses of an entry the cache holds for the same graph under another key, and what differed, old → new),
``cpu_fallback`` (TotalNumber,
FallbackOps: executions of CPU-fallback ops, counted at every call of a recipe, as the bridge does) and ``mark_step``
(TotalNumber: calls of ``hpu_backend.gaudi.mark_step``).
``PT_HPU_METRICS_FILE`` writes them as JSON at process exit in the bridge's format.
"""

from __future__ import annotations

import atexit
import copy
import datetime
import json
import logging
import os
import threading
from collections import Counter, deque
from typing import Any, Mapping

from . import envs
from .errors import HpuBackendError

_lock = threading.Lock()

# name -> tag -> value (a number, or a Counter for per-item tables)
_COUNTERS: dict[str, dict[str, Any]] = {
    "graph_compilation": {"TotalNumber": 0, "TotalTime": 0, "Reasons": Counter(), "RecompileCauses": Counter()},
    "recipe_cache": {"TotalHit": 0, "TotalMiss": 0, "RecipeHit": Counter(), "RecipeMiss": Counter(),
                     "ProgramHit": 0, "ProgramMiss": 0},
    "cache_misses": {"TotalNumber": 0, "Reasons": Counter()},
    "cpu_fallback": {"TotalNumber": 0, "FallbackOps": Counter()},
    "mark_step": {"TotalNumber": 0},
}


# Time spent in each compile phase of this backend (seconds), for benchmarks; not a bridge metric.
_PHASES: Counter = Counter()


def record_phase(name: str, seconds: float) -> None:
    with _lock:
        _PHASES[name] += seconds


def phase_times() -> dict[str, float]:
    with _lock:
        return dict(_PHASES)


class MetricError(HpuBackendError, KeyError):
    """An unknown metric name (raised by ``metric_global`` / ``metric_localcontext``)."""


def record_compilation(seconds: float, reason: str) -> None:
    with _lock:
        m = _COUNTERS["graph_compilation"]
        m["TotalNumber"] += 1
        m["TotalTime"] += int(seconds * 1e6)
        m["Reasons"][reason] += 1


_RECOMPILES: deque = deque(maxlen=1000)  # the latest recompiles explained (serve/recompiles.py), as dicts


def record_recompile(recompile: dict) -> None:
    with _lock:
        _COUNTERS["graph_compilation"]["RecompileCauses"][recompile["cause"]] += 1
        _RECOMPILES.append(recompile)


def recompiles() -> list[dict]:
    """The recompiles explained since process start (the latest 1000): function, guard, cause, variable,
    change and source line of each."""
    with _lock:
        return [dict(r) for r in _RECOMPILES]


def record_cache(recipe: str, hit: bool) -> None:
    with _lock:
        m = _COUNTERS["recipe_cache"]
        m["TotalHit" if hit else "TotalMiss"] += 1
        m["RecipeHit" if hit else "RecipeMiss"][recipe] += 1


def record_program(hit: bool) -> None:
    """A Dynamo graph served from a stored program (hit: no AOTAutograd trace) or traced (miss)."""
    with _lock:
        _COUNTERS["recipe_cache"]["ProgramHit" if hit else "ProgramMiss"] += 1


def record_miss_reasons(reasons: tuple[str, ...]) -> None:
    """A miss of an entry the cache holds under another key: what differed ("torch 2.13.0 → 2.13.1")."""
    with _lock:
        m = _COUNTERS["cache_misses"]
        m["TotalNumber"] += 1
        m["Reasons"].update(reasons)


def record_fallback(op: str, count: int = 1) -> None:
    with _lock:
        m = _COUNTERS["cpu_fallback"]
        m["TotalNumber"] += count
        m["FallbackOps"][op] += count


def record_mark_step() -> None:
    with _lock:
        _COUNTERS["mark_step"]["TotalNumber"] += 1


def _stats(name: str, values: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [(tag, dict(v) if isinstance(v, Counter) else v) for tag, v in values.items()]
    if name == "graph_compilation":
        n = values["TotalNumber"]
        out.insert(2, ("AvgTime", values["TotalTime"] / n if n else 0.0))
    return out


def _snapshot(name: str) -> dict[str, Any]:
    if name not in _COUNTERS:
        raise MetricError(f"unknown metric {name!r}; known: {', '.join(_COUNTERS)}")
    with _lock:
        return copy.deepcopy(_COUNTERS[name])


class _Global:
    def __init__(self, name: str):
        _snapshot(name)
        self.name = name

    def stats(self) -> list[tuple[str, Any]]:
        return _stats(self.name, _snapshot(self.name))


class _Local:
    """Counts only what happens between ``__enter__`` and ``__exit__`` (or now, if still open)."""

    def __init__(self, name: str):
        self.name = name
        self._start = _snapshot(name)
        self._end: dict[str, Any] | None = None

    def __enter__(self) -> "_Local":
        self._start = _snapshot(self.name)
        return self

    def __exit__(self, *exc) -> None:
        self._end = _snapshot(self.name)

    def stats(self) -> list[tuple[str, Any]]:
        end = self._end if self._end is not None else _snapshot(self.name)
        delta = {k: (+(v - self._start[k]) if isinstance(v, Counter) else v - self._start[k])
                 for k, v in end.items()}
        return _stats(self.name, delta)


def metric_global(name: str) -> _Global:
    return _Global(name)


def metric_localcontext(name: str) -> _Local:
    return _Local(name)


def metrics_file_path(base: str, env: Mapping[str, str] | None = None) -> str:
    """``base`` with ``-rank{N}`` under RANK, and a numeric suffix instead of overwriting a file."""
    root, ext = os.path.splitext(base)
    if envs.is_set("RANK", env):
        root = f"{root}-rank{envs.get('RANK', env)}"
    path, n = root + ext, 1
    while os.path.exists(path):
        path, n = f"{root}.{n}{ext}", n + 1
    return path


def dump(path: str, triggered_by: str = "process_exit") -> str:
    """Write all metrics as the bridge's JSON array; returns the path written."""
    now = datetime.datetime.now().isoformat(timespec="seconds")
    doc = [{"metric_name": name, "triggered_by": triggered_by, "generated_on": now,
            "statistics": dict(metric_global(name).stats())} for name in _COUNTERS]
    path = metrics_file_path(path)
    with open(path, "x") as f:
        json.dump(doc, f, indent=2)
    return path


def _dump_at_exit() -> None:
    base = envs.get("PT_HPU_METRICS_FILE")
    if base:
        try:
            dump(base)
        except OSError as e:
            logging.getLogger(__name__).warning("could not write PT_HPU_METRICS_FILE %s: %s", base, e)


atexit.register(_dump_at_exit)
