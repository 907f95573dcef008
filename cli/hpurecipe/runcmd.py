"""``hpurecipe run``: a Gaudi script, unchanged, on the simulated hpu device (``hpu_backend.run.launch``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import OneLineUsage, UsageError, mapped

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
            show_default=False)] = None,
        prefix: Annotated[bool, typer.Option(
            "--prefix", help="Start each line a rank prints with \\[rankN]: (as torchrun --tee shows ranks).")] = False,
        oversubscribe: Annotated[bool, typer.Option(
            "--oversubscribe", help="Start more ranks than this machine's memory holds (about 300 MB each).")]
        = False) -> None:
    """Run SCRIPT [ARGS...] as `python SCRIPT ARGS` would, on the simulated hpu device, Intel's module names
    answered by the simulator; a report (mode, compiles per step, recompiles, fallbacks, syncs, memory,
    estimated device time) goes to stderr at exit, or to --report. The recipes it built stay in the cache."""
    from hpu_backend.run import launch

    if script.startswith("-") and not Path(script).is_file():  # an option of ours misspelt, not a script's name
        raise UsageError(f"no such option: {script} (hpurecipe run's options come before SCRIPT; "
                         "see hpurecipe run --help)")
    code = launch(script, list(ctx.args), cards, str(report) if report else None, timeout, target,
                  str(trace) if trace else None, prefix, oversubscribe)
    if code:
        raise typer.Exit(code)


def alone(args: list[str]) -> None:
    """``hpurecipe run ARGS`` parsed by an app holding this one command, as a group like the full app's (the same
    help and one-line usage errors): a script's start-up does not wait for the other commands' parsers to be built
    (``main.main`` hands ``run`` here)."""
    app = typer.Typer(name="hpurecipe", cls=OneLineUsage, add_completion=False, pretty_exceptions_enable=False)
    app.callback()(_group)
    app.command("run", context_settings=CONTEXT)(mapped(run))
    app(["run", *args], prog_name="hpurecipe")


def _group() -> None:
    """The app of ``run`` alone."""
