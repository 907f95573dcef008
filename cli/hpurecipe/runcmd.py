"""``hpurecipe run``: a Gaudi script, unchanged, on the simulated hpu device (``hpu_backend.run.launch``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

# Everything after SCRIPT is the script's, options included (``--hpu``, even ``--cards``).
CONTEXT = {"allow_interspersed_args": False, "ignore_unknown_options": True, "allow_extra_args": True}


def run(ctx: typer.Context,
        script: Annotated[str, typer.Argument(help="The script, then its own arguments.", show_default=False)],
        cards: Annotated[int, typer.Option("--cards", "-n", help="Ranks (simulated cards) to start.")] = 1,
        report: Annotated[Optional[Path], typer.Option(
            "--report", help="Write the run's report as JSON here instead of stderr.", show_default=False)] = None,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", help="Stop every rank when one still runs after SECONDS.", show_default=False)] = None,
        target: Annotated[Optional[str], typer.Option(
            "--target", help="Device to plan and estimate for: gaudi2 | gaudi3 (default: the backend's).",
            show_default=False)] = None,
        trace: Annotated[Optional[Path], typer.Option(
            "--trace", help="Write the step timeline as a Chrome/Perfetto trace (one file per rank).",
            show_default=False)] = None) -> None:
    """Run SCRIPT [ARGS...] as `python SCRIPT ARGS` would, on the simulated hpu device, Intel's module names
    answered by the simulator; a report (mode, compiles per step, recompiles, fallbacks, syncs, memory,
    estimated device time) goes to stderr at exit, or to --report. The recipes it built stay in the cache."""
    from hpu_backend.run import launch

    code = launch(script, list(ctx.args), cards, str(report) if report else None, timeout, target,
                  str(trace) if trace else None)
    if code:
        raise typer.Exit(code)
