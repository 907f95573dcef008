"""``--trace FILE`` for the commands that plan shape points (``warm``, ``analyze``): the option, the early check
of the path, and the observer that collects the points and writes their step-timeline trace at the end."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer

from .errors import CliError

TraceFile = Annotated[Optional[Path], typer.Option(
    "--trace", help="Write a Chrome/Perfetto trace: each bucket one step, its recipes on the device's engine rows; "
    "with --input-len, one served request; with --train --seq, one optimizer step (estimates).",
    show_default=False)]


def check_trace(path: Path | None) -> None:
    """A trace path whose folder is missing or read-only fails before any work (one line)."""
    if path is None:
        return
    from hpu_backend.timeline.trace import TraceError, check_writable

    try:
        check_writable(str(path))
    except TraceError as e:
        raise CliError(str(e), 2) from None


@contextlib.contextmanager
def traced(path: Path | None, on_point: Callable | None, tool: str, target: str = "gaudi2") -> Iterator[Callable]:
    """``on_point`` that also keeps each point; at the end of the block, the trace of the points is written."""
    if path is None:
        yield on_point
        return
    points: list = []

    def keep(point) -> None:
        points.append(point)
        if on_point is not None:
            on_point(point)

    yield keep
    from hpu_backend.planning.plan_trace import write
    from hpu_backend.timeline.trace import TraceError

    try:
        write(str(path), points, target, tool)
    except TraceError as e:
        raise CliError(str(e)) from None
