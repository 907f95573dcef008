"""Precompiled directories: build one from a model file (``precompile``); ``show``, ``ls``, ``verify`` and
``coverage`` of one (or of one artifact file). Reading needs no torch: the manifest and each artifact's
description are plain data behind the signature."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hpu_backend.formats.precompiled import (MANIFEST, PrecompileError, describe, is_precompiled, read_artifact,
                                             read_manifest)

from . import render
from .errors import CliError
from .options import Axis, CacheDir, Json, ModelFile, Timeout
from .specs import load_spec

__all__ = ["is_precompiled", "precompile", "show", "ls", "verify", "covered", "precompiled_files",
           "write_precompiled"]


def precompile(model_file: ModelFile,
               output: Annotated[Optional[Path], typer.Option(
                   "--output", "-o", help="Directory to write (default: ./MODEL.precompiled).", show_default=False)]
               = None,
               axis: Axis = None, cache_dir: CacheDir = None, timeout: Timeout = None, json: Json = False) -> None:
    """Capture a model file with torch's aot_compile, one artifact per bucket range, for a start without Dynamo:
    hpu_backend.load_precompiled(DIR, model). Signed with HPURECIPE_BUNDLE_KEY if set (loads wherever it is set),
    else with this machine's own key (loads here only)."""
    from hpu_backend.modelfiles.modelspec import time_limit
    from hpu_backend.shipping.precompile import precompile as build

    from hpu_backend.shipping.cachepolicy import config_for

    with time_limit(timeout, model_file):
        spec = load_spec(model_file, axis)
        out = output or Path(f"{spec.name}.precompiled")
        status = render.err_console.status(f"precompiling {spec.name} over {len(spec.points())} points...")
        with contextlib.nullcontext() if json else status:
            report = build(spec, out, config_for(cache_dir))
    if json:
        return render.emit_json(report.__dict__)
    _rows(report.artifacts)
    render.note("Wrote {} ({}), {}.", report.directory, render.plural(len(report.artifacts), "artifact"),
                "signed with HPURECIPE_BUNDLE_KEY" if report.signer == "team" else "signed with this machine's own "
                "key: it loads here only (to load it elsewhere, precompile and load with HPURECIPE_BUNDLE_KEY set)")


def _rows(artifacts: list[dict[str, Any]]) -> None:
    render.table(["artifact", "serves", "points", "recipes", "size", "recipes size", "× recipes"],
                 ([a["file"], _served(a), a.get("points", "-"), a["recipes"], render.size(a["bytes"]),
                   render.size(a["recipe_bytes"]), _ratio(a["bytes"], a["recipe_bytes"])] for a in artifacts),
                 right=("points", "recipes", "size", "recipes size", "× recipes"))


def _ratio(size: int, recipe_bytes: int) -> str:
    """The artifact's size over the recipes it holds (what it costs beyond them)."""
    return f"{size / recipe_bytes:.2f}" if recipe_bytes else "-"


def _serves(artifact: dict) -> dict[str, list]:
    """Per axis, the spans of sizes an artifact serves from its recipes; for an artifact written before they were
    recorded, the range of its points."""
    if artifact.get("serves"):
        return artifact["serves"]
    return {k: [v] for k, v in artifact["ranges"].items() if isinstance(v, list) and len(v) == 2}


def _served(artifact: dict) -> str:
    """The sizes an artifact serves ("batch=2..3,5..8 seq=2..128")."""
    serves = _serves(artifact)
    return " ".join(f"{k}=" + ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in spans)
                    for k, spans in serves.items()) or "-"


def _open(path: Path, listing: bool = False) -> tuple[dict | None, list[tuple[Path, Any]]]:
    """(manifest or None, [(artifact path, Artifact)]) of a directory or of one artifact file, all checked.
    ``listing``: files whose signature cannot be checked here are read too (``ls``, ``show``): only their plain
    descriptions, which are msgpack and JSON data; torch's part is left unread. Loading, verifying and exporting
    need a signature the key here checks."""
    if not path.exists():
        raise CliError(f"{path}: no such precompiled directory or artifact")
    if path.is_dir():
        manifest = read_manifest(path, listing=listing)
        arts = []
        for entry in manifest["artifacts"]:
            file = path / entry["file"]
            if not file.exists():
                raise PrecompileError(f"{path}: {entry['file']} is listed in the manifest but missing")
            art = read_artifact(file, listing=listing)
            if art.digest != entry["sha256"]:
                raise PrecompileError(f"{file}: not the artifact the manifest lists (checksum differs)")
            arts.append((file, art))
        return manifest, arts
    return None, [(path, read_artifact(path, listing=listing))]


def _described(path: Path) -> tuple[dict | None, list[dict]]:
    manifest, arts = _open(path, listing=True)
    points = {e["file"]: e.get("points", "-") for e in (manifest or {}).get("artifacts", [])}
    return manifest, [dict(describe(a, p), points=points.get(p.name, "-")) for p, a in arts]


def show(path: Path, json: bool) -> None:
    manifest, docs = _described(path)
    if json:
        return render.emit_json({"path": str(path), "manifest": manifest, "artifacts": docs})
    fp = docs[0]["fingerprint"]
    render.pairs({"precompiled": str(path), "model": docs[0]["model"], "mode": docs[0]["mode"],
                  "signature": "; ".join(dict.fromkeys(d["signature"] for d in docs)),
                  "fingerprint": ", ".join(f"{k}={v}" for k, v in fp.items() if k != "settings"),
                  "settings": ", ".join(f"{k}={v}" for k, v in fp["settings"].items()) or "defaults"})
    ls_rows(docs)


def ls(path: Path, json: bool) -> None:
    _, docs = _described(path)
    render.emit_json(docs) if json else ls_rows(docs)


def ls_rows(docs: list[dict]) -> None:
    _rows([{"file": Path(d["path"]).name, "ranges": d["ranges"], "serves": d.get("serves"), "points": d["points"],
            "recipes": len(d["recipes"]),
            "bytes": d["bytes"], "recipe_bytes": d["recipe_bytes"]} for d in docs])


def verify(path: Path, json: bool) -> None:
    """Signature, checksum and description of every artifact, and the manifest listing them."""
    manifest, arts = _open(path)
    doc = {"precompiled": str(path), "artifacts": len(arts), "signed": all(a.signed for _, a in arts),
           "signature": arts[0][1].signature, "recipes": sum(len(a.info["recipes"]) for _, a in arts)}
    if json:
        return render.emit_json(doc)
    render.note("{}: {} checked: signature, checksum and description ({} recipes, signature {}).", path,
                render.plural(len(arts), "artifact"), doc["recipes"], doc["signature"])


def covered(directory: Path, points: list[dict[str, int]]) -> list[dict[str, Any]]:
    """Per point of a model file: the artifact whose ranges hold it ("" when none does)."""
    manifest = read_manifest(directory)
    rows = []
    for point in points:
        holder = next((a["file"] for a in manifest["artifacts"] if _holds(a, point)), "")
        rows.append({"bucket": render.point(point), "artifact": holder})
    return rows


def _holds(artifact: dict, point: dict[str, int]) -> bool:
    """Whether the artifact serves the point: within its served sizes on every axis (an artifact written before
    they were recorded: the range of its points)."""
    serves = _serves(artifact)
    return all(axis not in point or any(lo <= point[axis] <= hi for lo, hi in spans) for axis, spans in serves.items())


def precompiled_files(directory: Path) -> dict[str, bytes]:
    """name -> bytes of a precompiled directory's manifest and artifacts, each checked (for export)."""
    manifest, arts = _open(directory)
    if manifest is None:
        raise CliError(f"{directory}: export ships a precompiled directory, not one artifact")
    files = {MANIFEST: (directory / MANIFEST).read_bytes()}
    files.update({p.name: p.read_bytes() for p, _ in arts})
    return files


def write_precompiled(directory: Path, files: dict[str, bytes], bundle: Path) -> None:
    """Write a bundle's precompiled files into ``directory`` (new, or one precompiled before), then check them."""
    if MANIFEST not in files:
        raise CliError(f"{bundle}: holds no precompiled directory")
    if directory.exists() and (not directory.is_dir() or any(
            p.name != MANIFEST and not p.name.endswith(".hpuaot") for p in directory.iterdir())):
        raise CliError(f"{directory}: exists and is not a precompiled directory; give a new one")
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = directory / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.write_bytes(data)
        tmp.replace(directory / name)
    _open(directory)  # signature, checksum, description of each: refused in one line if anything is off
