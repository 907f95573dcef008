"""Commands that run a model file over its shape buckets: warm, prebuild, coverage, analyze.

They import torch when they run, not when the CLI starts (the cache-only commands never do).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Annotated, Iterator, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hpu_backend.aot.manifests import manifest, write_manifest
from hpu_backend.aot.modelfile import ModelSpec
from hpu_backend.settings import TARGETS
from recipecache.config import ENV_VAR

from . import render
from .caches import config_for, open_cache
from .errors import UsageError, fail
from .options import Axis, CacheDir, Json, ModelFile, Train
from .specs import load_spec

if TYPE_CHECKING:
    from hpu_backend.aot.warm import PointResult, WarmReport


@contextlib.contextmanager
def progress(total: int, quiet: bool) -> Iterator:
    """A progress bar on stderr showing the last bucket done (compiled or hit, time), and its callback."""
    if quiet:
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=render.err_console, transient=True)

    def on_point(p: PointResult) -> None:
        bar.update(task, advance=1, last=f"{p.label}: {p.status}, {render.duration(p.seconds)}")

    with bar:
        task = bar.add_task("buckets", total=total, last="compiling the first bucket...")
        yield on_point


def warm(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
         check: Annotated[bool, typer.Option("--check", help="Compare every output with eager PyTorch.")] = False,
         json: Json = False) -> None:
    """Compile and run every bucket of a model file once, filling the cache; write its manifest."""
    from hpu_backend.aot.warm import warm as warm_spec

    spec = load_spec(model_file, axis)
    config = _enabled(config_for(cache_dir), "warm")
    with progress(len(spec.points()), json) as on_point:
        report = warm_spec(spec, config, train=train, check=check, on_point=on_point)
    _finish(report, spec, config, json, check)


def prebuild(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
             jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Worker processes.")] = 1,
             json: Json = False) -> None:
    """Compile every bucket without running recipes (compile-only), across worker processes."""
    from hpu_backend.aot.warm import prebuild as prebuild_spec

    spec = load_spec(model_file, axis)
    config = _enabled(config_for(cache_dir), "prebuild")
    with progress(len(spec.points()), json) as on_point:
        report = prebuild_spec(spec, config, jobs=jobs, train=train, on_point=on_point)
    _finish(report, spec, config, json, False)


def _enabled(config, command: str):
    if config.max_size_mb == 0:
        raise UsageError(f"the recipe cache is disabled (max_size_mb 0), so {command} has nowhere to store "
                         f"recipes; give it a size in {ENV_VAR}")
    return config


def _finish(report: WarmReport, spec: ModelSpec, config, json: bool, check: bool) -> None:
    doc = manifest(report, spec)
    if config.remote:  # the fleet tier gets the manifest too, so that other hosts can pull just these keys
        from .shipcmds import push_manifest

        push_manifest(config, doc)
    try:
        path = write_manifest(config.resolved_path(), doc)
    except OSError as e:  # a read-only or full cache: the run itself is fine, only its record is missing
        path = None
        render.warn(f"cannot write the manifest ({e.strerror or e}); recipes that could be stored are in the "
                    f"cache, but coverage and export will not know this run")
    if json:
        render.emit_json({**report.to_dict(), "manifest": str(path)})
    else:
        _print_report(report, check)
        s = report.summary()
        render.note("{} shape points using {} distinct recipes: {} compiled, {} reused (from the cache or "
                    "an earlier point), in {}. Manifest: {}", s["buckets"], s["recipes"], s["compiled"], s["hits"],
                    render.duration(s["seconds"]), path or "not written")
    if report.summary()["mismatches"]:
        raise fail(f"{report.summary()['mismatches']} buckets differ from eager (see --check above)")


def _print_report(report: WarmReport, check: bool) -> None:
    columns = ["bucket", "status", "recipes", "compiled", "hits", "time"] + (["max |diff|", "check"] if check else [])
    rows = []
    for p in report.points:
        row = [p.label, p.status, len(p.keys), p.compiled, p.hits, render.duration(p.seconds)]
        if check:
            row += [f"{p.max_abs_diff:.2e}" if p.max_abs_diff is not None else "-", p.check_error or "ok"]
        rows.append(row)
    render.table(columns, rows, right=("recipes", "compiled", "hits", "time", "max |diff|"))


def coverage(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
             json: Json = False) -> None:
    """Which buckets have all their recipes in the cache; exit 1 if any is missing (a deployment gate)."""
    from hpu_backend.aot.warm import plan

    spec = load_spec(model_file, axis)
    cache = open_cache(cache_dir, quiet=True)
    points = plan(spec, train=train)
    rows = [{"bucket": p.label, "recipes": len(p.keys),
             "missing": [k for k in p.keys + p.programs if cache is None or not cache.contains(k)]}
            for p in points]
    uncovered = [r["bucket"] for r in rows if r["missing"]]
    if json:
        render.emit_json({"model": spec.name, "buckets": len(rows), "covered": len(rows) - len(uncovered),
                          "uncovered": uncovered, "points": rows})
    else:
        render.table(["bucket", "recipes", "missing", "status"],
                     ([r["bucket"], r["recipes"], len(r["missing"]), "missing" if r["missing"] else "ok"]
                      for r in rows), right=("recipes", "missing"))
        render.note("{} of {} buckets covered in {}.", len(rows) - len(uncovered), len(rows),
                    config_for(cache_dir).resolved_path())
    if uncovered:
        raise fail(f"{len(uncovered)} buckets are not fully cached; run: hpurecipe warm {model_file}")


DTYPE_CHOICES = ("bf16", "fp8")  # hpu_backend.aot.capacity.DTYPES, without importing torch at start-up


def analyze(model_file: ModelFile, axis: Axis = None, train: Train = False,
            target: Annotated[str, typer.Option(help=f"Device to plan for: {' or '.join(TARGETS)}.")] = TARGETS[0],
            input_len: Annotated[Optional[int], typer.Option(
                "--input-len", help="Capacity planning: prompt tokens per sequence (with --output-len).",
                show_default=False)] = None,
            output_len: Annotated[Optional[int], typer.Option(
                "--output-len", help="Capacity planning: generated tokens per sequence (with --input-len).",
                show_default=False)] = None,
            dtype: Annotated[Optional[str], typer.Option(
                help="Capacity planning: bf16, or fp8 (weights and matmul inputs in fp8). Default bf16.",
                show_default=False)] = None,
            batch: Annotated[Optional[int], typer.Option(
                help="Capacity planning: the batch for tokens/s (default: the largest that fits).",
                show_default=False)] = None,
            cards: Annotated[Optional[int], typer.Option(
                help="Capacity planning: tensor parallel over this many cards of one server (per-card plan; "
                     "a model file with PER_CARD).", show_default=False)] = None,
            seq: Annotated[Optional[int], typer.Option(
                help="Training plan (with --train): tokens per sequence.", show_default=False)] = None,
            global_batch: Annotated[Optional[int], typer.Option(
                "--global-batch", help="Training plan: sequences per optimizer step over all cards.",
                show_default=False)] = None,
            zero: Annotated[int, typer.Option(help="Training plan: ZeRO stage 0-3 (3 = FSDP full sharding).")] = 0,
            tp: Annotated[int, typer.Option(help="Training plan: tensor-parallel cards (of --cards).")] = 1,
            bucket_mb: Annotated[float, typer.Option(
                "--bucket-mb", help="Training plan: DDP/ZeRO gradient bucket size in MB.")] = 25.0,
            checkpointing: Annotated[str, typer.Option(
                help="Training plan: activation checkpointing, none or full.")] = "none",
            search: Annotated[bool, typer.Option(
                "--search", help="Training plan: the fastest layout (TP, ZeRO, checkpointing) that fits.")] = False,
            json: Json = False) -> None:
    """Per bucket: CPU fallbacks, graph breaks, recompilations, estimated time and peak HBM; the largest batch
    that fits the target's HBM. With --input-len and --output-len (a model file with a DECODE step): the
    prefill and decode steps without weights, the largest batch and tokens/s. With --train --seq
    --global-batch: a whole training step across --cards (ZeRO, TP, buckets, checkpointing) without weights,
    per-card memory by category, the largest micro-batch and tokens/s. Reads and writes no cache."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected {' or '.join(TARGETS)}")
    if seq is not None or global_batch is not None:
        if input_len is not None or output_len is not None:
            raise UsageError("--input-len/--output-len plan inference, --seq/--global-batch a training step: "
                             "give one pair")
        _training(model_file, axis, train, target, seq, global_batch, dtype or "bf16", batch, cards or 1, zero,
                  tp, bucket_mb, checkpointing, search, json)
        return
    if input_len is None and output_len is None:
        if dtype is not None or batch is not None or cards is not None:
            raise UsageError("--dtype, --batch and --cards are for capacity planning: give --input-len and "
                             "--output-len too")
        from hpu_backend.aot.analyze import analyze_spec

        from .analysis import print_analysis

        doc = analyze_spec(load_spec(model_file, axis), target, train)
        render.emit_json(doc) if json else print_analysis(doc)
        return
    _capacity(model_file, axis, train, target, input_len, output_len, dtype or "bf16", batch, cards, json)


def _capacity(model_file: str, axis, train: bool, target: str, input_len: int | None, output_len: int | None,
              dtype: str, batch: int | None, cards: int | None, json: bool) -> None:
    if input_len is None or output_len is None:
        raise UsageError("capacity planning needs both --input-len and --output-len, e.g. --input-len 128 "
                         "--output-len 128")
    if dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {dtype!r}: expected {' or '.join(DTYPE_CHOICES)}")
    for name, value in (("--input-len", input_len), ("--output-len", output_len), ("--batch", batch),
                        ("--cards", cards)):
        if value is not None and value < 1:
            raise UsageError(f"{name} {value}: expected a positive integer")
    if train or axis:
        raise UsageError("capacity planning estimates inference at the sizes given: drop --train and --axis")
    from hpu_backend.aot.capacity import capacity

    from .analysis import print_capacity

    doc = capacity(load_spec(model_file, None), target, dtype, input_len, output_len, batch, cards)
    render.emit_json(doc) if json else print_capacity(doc)


def _training(model_file: str, axis, train: bool, target: str, seq: int | None, global_batch: int | None,
              dtype: str, batch: int | None, cards: int, zero: int, tp: int, bucket_mb: float, checkpointing: str,
              search: bool, json: bool) -> None:
    if not train or seq is None or global_batch is None or axis:
        raise UsageError("a training plan needs --train, --seq and --global-batch (and no --axis), e.g. --train "
                         "--seq 4096 --global-batch 1024 --cards 8 --zero 1")
    if dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {dtype!r}: expected {' or '.join(DTYPE_CHOICES)}")
    from hpu_backend.aot.training_plan import plan_training

    from .analysis import print_training

    doc = plan_training(load_spec(model_file, None), target, dtype, seq, global_batch, cards, zero, tp, bucket_mb,
                        checkpointing, batch, search)
    render.emit_json(doc) if json else print_training(doc)
