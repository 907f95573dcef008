"""Option aliases shared by the commands, defined once (typer ``Annotated`` style)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from recipecache.config import ENV_VAR

CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", "-d", help=f"Cache directory (default: as the backend, {ENV_VAR}, "
    "else ~/.cache/hpu_backend/recipes).", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing.")]
Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Only entries with this model label.")]
ModelFile = Annotated[str, typer.Argument(
    help="Model file (path.py, or path.py:attr): make_model, make_inputs, AXES, COMPILE.", show_default=False)]
Axis = Annotated[Optional[list[str]], typer.Option(
    "--axis", "-a", help="Override an axis: NAME=V1,V2,... (repeatable).", show_default=False)]
Train = Annotated[bool, typer.Option("--train", help="Warm training graphs (forward, loss, backward).")]
Remote = Annotated[Optional[str], typer.Option(
    "--remote", help="Fleet tier URL, redis://host:port/db (default: HPU_RECIPE_CACHE_REMOTE).", show_default=False)]
Key = Annotated[str, typer.Argument(help="A recipe key, or a unique prefix of one (or a package file).",
                                    show_default=False)]
Timeout = Annotated[Optional[float], typer.Option(
    "--timeout", min=0, help="Stop with an error when the model file's code runs longer than SECONDS in all.",
    show_default=False)]
