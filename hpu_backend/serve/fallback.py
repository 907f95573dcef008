"""CPU-fallback reporting in the Gaudi bridge's format: one line per fallback op, a frequency table at exit.

With ``LOG_LEVEL_PT_FALLBACK`` (or ``LOG_LEVEL_ALL``) at 1 or lower, each fallback op prints
``CPU fallback digamma : self=HPUBFloat16Type`` and the process ends with::

    Frequency of op and op name that were executed on CPU:
    1       aten::digamma

on the console (stderr) when ``ENABLE_CONSOLE=true``, else through the ``hpu_backend.serve.fallback``
logger. As on the bridge, the table and the ``cpu_fallback`` metric count executions: each call of a
recipe counts each of its fallback ops once (``executed``). The line is printed once, when a recipe
holding the fallback is taken up by this process (compiled, or loaded from the cache), and
``recipe_counts()`` keeps the per-recipe count: each op's fallback nodes in the recipes taken up.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections import Counter
from typing import Mapping

from .. import envs, metrics
from ..formats.recipe import Recipe
from ..lowering.errors import LoweringError

log = logging.getLogger(__name__)

HEADER = "Frequency of op and op name that were executed on CPU:"

_lock = threading.Lock()
_counts: Counter = Counter()  # executions per fallback op
_recipe_counts: Counter = Counter()  # fallback nodes per op in the recipes taken up
_dtypes: dict[str, set] = {}  # fallback op -> the dtypes of its inputs, over the recipes taken up
_exit_registered = False


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """The bridge logs fallbacks at level 1 (debug) and below; 0 is trace."""
    level = envs.get("LOG_LEVEL_PT_FALLBACK", env)
    level = envs.get("LOG_LEVEL_ALL", env) if level is None else level
    return level is not None and level <= 1


def report(recipe: Recipe, strict: bool = False, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Print (if enabled) the CPU fallbacks of a recipe this process takes up; returns their op names,
    which the caller passes to ``executed`` at every call of the recipe.

    In strict mode a recipe with fallbacks is a LoweringError (unless every fallback is a library's
    custom op, which has no device kernel anywhere): lowering raises it already, and a recipe from the
    cache (strict is not part of its key) must not slip past it.
    """
    fallbacks = recipe.facts.get("placement", {}).get("fallbacks", [])
    if not fallbacks:
        return ()
    refused = [fb for fb in fallbacks if not fb.get("library")]  # a library op's fallback is a known one
    if strict and refused:
        fb = refused[0]
        raise LoweringError(f"CPU fallback of {fb['op']} ({', '.join(fb['dtypes'])}) in strict mode: "
                            f"{fb.get('reason', 'not supported on HPU')}", graph=recipe.name)
    show = enabled(env)
    with _lock:
        _recipe_counts.update(fb["op"] for fb in fallbacks)
        for fb in fallbacks:
            _dtypes.setdefault(fb["op"], set()).update(fb.get("dtypes") or ())
    for fb in fallbacks:
        if show:
            _emit(fb["line"], env)
    if show:
        _print_table_at_exit(env)
    return tuple(fb["op"] for fb in fallbacks)


def executed(ops: tuple[str, ...]) -> None:
    """One call of a recipe whose fallback ops are ``ops`` (from ``report``): each counts once."""
    for op in ops:
        metrics.record_fallback(op)
    with _lock:
        _counts.update(ops)


def counts() -> Counter:
    """Executions of each fallback op in this process (what the exit table prints)."""
    with _lock:
        return Counter(_counts)


def dtypes(op: str) -> list[str]:
    """The input dtypes a fallback op had in the recipes this process took up (why an op Gaudi supports fell back:
    a dtype it lacks, such as float64), sorted."""
    with _lock:
        return sorted(_dtypes.get(op, ()))


def recipe_counts() -> Counter:
    """Each op's fallback nodes in the recipes this process took up (counted once per recipe, not per call)."""
    with _lock:
        return Counter(_recipe_counts)


def frequency_table(table: Mapping[str, int]) -> str:
    rows = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))
    return "\n".join([HEADER, *(f"{n:<8}{op}" for op, n in rows)])


def emit(line: str, env: Mapping[str, str] | None = None) -> None:
    """Print one fallback line (an op the hpu device runs on the CPU) and the frequency table at exit."""
    _emit(line, env)
    _print_table_at_exit(env)


def _emit(text: str, env: Mapping[str, str]) -> None:
    if envs.get("ENABLE_CONSOLE", env):
        print(text, file=sys.stderr, flush=True)
    else:
        log.info("%s", text)


def _print_table_at_exit(env: Mapping[str, str]) -> None:
    global _exit_registered
    with _lock:
        if _exit_registered:
            return
        _exit_registered = True
    atexit.register(lambda: _emit(frequency_table(counts()), env))
