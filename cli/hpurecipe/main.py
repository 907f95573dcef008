"""The ``hpurecipe`` application: every command registered on one typer app, errors mapped in one place."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from hpu_backend.formats.recipe import FORMAT_VERSION as RECIPE_FORMAT
from hpu_backend.version import __version__
from recipecache import FORMAT_VERSION as ENTRY_FORMAT
from recipecache.config import ENV_VAR

from . import buildcmds, cachecmds, packagecmds, perftool, precompilecmds, runcmd, servingcmd, shipcmds
from .errors import OneLineUsage, mapped

app = typer.Typer(
    name="hpurecipe", cls=OneLineUsage, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Prebuild, warm, inspect, evict, verify and ship the hpu_backend recipe cache.\n\n"
         f"Every command works on the backend's cache ({ENV_VAR}, else "
         "~/.cache/hpu_backend/recipes) unless given --cache-dir.")

COMMANDS = [
    ("warm", buildcmds.warm), ("prebuild", buildcmds.prebuild), ("coverage", buildcmds.coverage),
    ("analyze", buildcmds.analyze), ("advise", buildcmds.advise), ("package", packagecmds.package),
    ("precompile", precompilecmds.precompile), ("ls", cachecmds.ls), ("show", cachecmds.show),
    ("stats", cachecmds.stats),
    ("evict", cachecmds.evict), ("verify", cachecmds.verify), ("clear", cachecmds.clear),
    ("explain", cachecmds.explain), ("export", shipcmds.export), ("import", shipcmds.import_),
    ("push", shipcmds.push), ("pull", shipcmds.pull), ("perf-tool", perftool.perf_tool),
    ("serving-plan", servingcmd.serving_plan),
]
for _name, _fn in COMMANDS:
    app.command(_name)(mapped(_fn))
app.command("run", context_settings=runcmd.CONTEXT)(mapped(runcmd.run))


def _print_version(value: bool) -> None:
    if value:
        # The names `show` prints: a recipe's recipe_format, and the cache entry's header around it.
        typer.echo(f"hpurecipe {__version__} (hpu_backend {__version__}; recipe_format {RECIPE_FORMAT}, "
                   f"cache entry format {ENTRY_FORMAT})")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """Prebuild, warm, inspect, evict, verify and ship the hpu_backend recipe cache."""


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    if sys.argv[1:2] == ["run"]:
        runcmd.alone(sys.argv[2:])  # start-up before a script's first line counts: skip the other commands
    app(prog_name="hpurecipe")


if __name__ == "__main__":
    main()
