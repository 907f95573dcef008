"""Option aliases shared by the commands, defined once (typer ``Annotated`` style), and the valid range of
every numeric option."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from hpu_backend.settings import TARGETS
from hpu_backend.targets import target_problem
from recipecache.config import ENV_VAR

from .errors import fail

# The valid range of every numeric option, in one place. A value outside it is a one-line usage error when the
# command line is parsed: an infinite, NaN or 20-digit value would otherwise overflow, or run for hours, deep
# inside the command. Ages are in seconds, sizes in bytes.
BOUNDS: dict[str, tuple[float, float]] = {
    "--jobs": (1, 1024), "--timeout": (0, 7 * 86400),
    "--input-len": (1, 1 << 24), "--output-len": (1, 1 << 24), "--batch": (1, 1 << 20), "--cards": (1, 1024),
    "--seq": (1, 1 << 24), "--global-batch": (1, 1 << 24), "--zero": (0, 3), "--tp": (1, 1024),
    "--bucket-mb": (0.001, 1 << 20), "--older-than": (0, 100 * 365 * 86400), "--max-size": (0, 1 << 60),
}


def out_of_bounds(name: str, value: float) -> str | None:
    """Why ``value`` is not valid for the option ``name`` (see BOUNDS), or None."""
    low, high = BOUNDS[name]
    if not (isinstance(value, int) or math.isfinite(value)) or not low <= value <= high:  # NaN fails both
        if isinstance(value, float):
            return f"{name} {value:g}: expected a number from {_num(low)} to {_num(high)}"
        if low == 1:
            return f"{name} {value}: expected a positive integer, at most {_num(high)}"
        return f"{name} {value}: expected an integer from {_num(low)} to {_num(high)}"
    return None


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def bounded(name: str) -> Callable:
    """A typer callback that refuses a value of the option ``name`` outside BOUNDS (usage error, exit 2)."""
    def check(value):
        problem = None if value is None else out_of_bounds(name, value)
        if problem is not None:
            raise fail(problem, 2)
        return value
    return check


def known_target(value: str) -> str:
    """A typer callback that refuses a --target naming no device (usage error, exit 2)."""
    problem = target_problem(value)
    if problem is not None:
        raise fail(problem, 2)
    return value


def target_option(help: str) -> typer.Option:
    """--target, checked when the command line is parsed; ``help`` ends with the device names."""
    return typer.Option(callback=known_target, help=f"{help}: {' or '.join(TARGETS)}.")


CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", "-d", help=f"Cache directory (default: as the backend, {ENV_VAR}, "
    "else ~/.cache/hpu_backend/recipes).", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing.")]
Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Only entries with this model label.")]
ModelFile = Annotated[str, typer.Argument(
    help="Model file (path.py, or path.py:attr): make_model, make_inputs, AXES, COMPILE; or a Hugging Face "
    "config.json (or its directory).", show_default=False)]
Axis = Annotated[Optional[list[str]], typer.Option(
    "--axis", "-a", help="Override an axis: NAME=V1,V2,... (repeatable).", show_default=False)]
Train = Annotated[bool, typer.Option("--train", help="Warm training graphs (forward, loss, backward).")]
Remote = Annotated[Optional[str], typer.Option(
    "--remote", help="Fleet tier URL, redis://host:port/db (default: HPU_RECIPE_CACHE_REMOTE).", show_default=False)]
PlanTarget = Annotated[str, target_option("Device to plan for")]
Key = Annotated[str, typer.Argument(help="A recipe key, or a unique prefix of one (or a package file).",
                                    show_default=False)]
Timeout = Annotated[Optional[float], typer.Option(
    "--timeout", callback=bounded("--timeout"),
    help="Stop with an error when the model file's code runs longer than SECONDS in all.", show_default=False)]
