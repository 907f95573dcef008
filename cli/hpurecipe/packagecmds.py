"""Recipe packages: build one from a model file (``package``); ``show``, ``ls`` and ``verify`` of a package file."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from hpu_backend.formats.package import Package, check_destination, check_toolchain, describe, read_package

from . import render
from .specs import load_spec
from .errors import CliError
from .options import Axis, Json, ModelFile, Timeout

PACKAGE_SUFFIX = ".hpkg"
PackageFile = Annotated[Optional[Path], typer.Argument(
    help=f"A package file ({PACKAGE_SUFFIX}, from hpurecipe package), or a precompiled directory or artifact "
    "(hpurecipe precompile), instead of the cache.", show_default=False)]


def package(model_file: ModelFile,
            output: Annotated[Optional[Path], typer.Option(
                "--output", "-o", help=f"Package file to write (default: ./MODEL{PACKAGE_SUFFIX}).",
                show_default=False)] = None,
            axis: Axis = None,
            with_weights: Annotated[bool, typer.Option(
                "--with-weights", help="Store the parameters and buffers, so load_package needs no model.")] = False,
            check: Annotated[bool, typer.Option(
                "--check/--no-check", help="Load the written package and compare it with eager at every point.")]
            = True,
            timeout: Timeout = None, json: Json = False) -> None:
    """Export a model file over its axes and write one package that serves every bucket with no trace:
    hpu_backend.load_package(path, model)."""
    from hpu_backend.shipping.package import build_package
    from hpu_backend.modelfiles.modelspec import time_limit

    if output is not None:
        check_destination(output)  # before the model loads: a path that cannot be written is refused at once
    with time_limit(timeout, model_file):
        spec = load_spec(model_file, axis)
        path = output or Path(f"{spec.name}{PACKAGE_SUFFIX}")
        status = render.err_console.status(f"packaging {spec.name} over {len(spec.points())} points...")
        with contextlib.nullcontext() if json else status:
            report = build_package(spec, path, with_weights=with_weights, check=check)
    if json:
        return render.emit_json(report.__dict__)
    render.table(["bucket", "points"], ([render.bucket(b["bucket"]), ", ".join(b["points"])] for b in report.buckets))
    render.note("Wrote {} ({}, {} recipes{}{}) in {}; {}.", report.path, render.size(report.size_bytes),
                len(report.buckets), ", with weights" if with_weights else "", ", signed" if report.signed else "",
                render.duration(report.seconds),
                f"matches eager at {len(report.checked)} points" if check else "not checked against eager")


def is_package(arg: str) -> bool:
    """Whether a show/ls/verify argument names a package file rather than a cache key."""
    return arg.endswith(PACKAGE_SUFFIX) or "/" in arg or Path(arg).is_file()


def open_package(path: Path) -> Package:
    """The package file, checked (read_package refuses a FIFO or a device without blocking)."""
    if not path.exists():
        raise CliError(f"{path}: no such package file")
    return read_package(path)


def show(path: Path, json: bool) -> None:
    doc = {"path": str(path), "size": path.stat().st_size if path.is_file() else 0, **describe(open_package(path))}
    if json:
        return render.emit_json(doc)
    render.pairs({"package": doc["path"], "model": doc["model"], "size": render.size(doc["size"]),
                  "toolchain": ", ".join(f"{k}={v}" for k, v in doc["toolchain"].items()),
                  "inputs": ", ".join(f"{n} {k}" for k, n in doc["inputs"].items() if n),
                  "weights": "stored" if doc["with_weights"] else "from the model passed to load_package",
                  "axes": ", ".join(f"{a}={v}" for a, v in doc["axes"].items()) or "none",
                  "serves": _spans(doc["serves"])})
    ls_rows(doc)


def ls(path: Path, json: bool) -> None:
    doc = describe(open_package(path))
    render.emit_json(doc["buckets"]) if json else ls_rows(doc)


def ls_rows(doc: dict) -> None:
    render.table(["bucket", "nodes", "est. time", "peak HBM"],
                 ([render.bucket(b["bucket"]), b["nodes"], _seconds(b["time_s"]),
                   render.size(b["peak_hbm_bytes"] or 0)] for b in doc["buckets"]),
                 title=f"\nbuckets ({len(doc['buckets'])})", right=("nodes", "est. time", "peak HBM"))


def verify(path: Path, json: bool) -> None:
    """Checksum, signature and format, toolchain, what the package does (no writes into its inputs, its
    declared shapes and memory plan), and every recipe through the runtime's checked loader (imports torch)."""
    from hpu_backend.runtime import RecipeLoadError, build_callable
    from hpu_backend.runtime.packaged import check_package

    problems = []
    package = open_package(path)
    check_toolchain(package, path)
    check_package(package, path, run_on_meta=True)
    for recipe in package.recipes:
        try:
            build_callable(recipe)
        except RecipeLoadError as e:
            problems.append({"bucket": render.bucket(recipe.bucket), "reason": str(e)})
    if json:
        render.emit_json({"package": str(path), "recipes": len(package.recipes), "bad": len(problems),
                          "problems": problems})
    elif problems:
        render.table(["bucket", "problem"], ([p["bucket"], p["reason"]] for p in problems))
    else:
        render.note("{}: all {} recipes load.", path, len(package.recipes))
    if problems:
        raise typer.Exit(1)


def _spans(serves: dict[str, list[list[int]]]) -> str:
    """``s0=1-2, 5-8``: the sizes each symbol may take (a size between two spans has no recipe)."""
    return " ".join(f"{sym}=" + ", ".join(f"{a}-{b}" for a, b in spans) for sym, spans in serves.items()) or "-"


def _seconds(s: float | None) -> str:
    return "-" if s is None else render.duration(s)
