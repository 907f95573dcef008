"""Commands that run a model file over its shape buckets: warm, prebuild, coverage, analyze, advise.

They import torch when they run, not when the CLI starts (the cache-only commands never do).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hpu_backend.shipping.cachepolicy import config_to_fill
from hpu_backend.modelfiles.modelspec import time_limit
from hpu_backend.settings import TARGETS
from hpu_backend.targets import layout_problem

from . import render
from .warmreport import finish, progress, too_small
from .caches import config_for, open_cache
from .errors import UsageError, fail
from .options import Axis, CacheDir, Json, ModelFile, Timeout, Train, bounded
from .specs import load_spec
from .tracing import TraceFile, check_trace, traced

Cards = Annotated[int, typer.Option(
    "--cards", callback=bounded("--cards"),
    help="Build every rank of a tensor-parallel deployment over N cards (the model file's PER_CARD shard), in "
    "this process: ranks with identical graphs share recipes, so each unique graph compiles once.")]


@contextlib.contextmanager
def stages(what: str, quiet: bool) -> Iterator[Callable[[str], None] | None]:
    """A spinner line on stderr for a long plan (capacity, training, advise): ``what``, the stage it is at and
    the time so far; the callback sets the stage. On a terminal only, not with ``quiet`` (--json); gone when
    done."""
    if quiet or not render.err_console.is_terminal:
        yield None
        return
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                   TextColumn("{task.fields[stage]}"), console=render.err_console, transient=True)

    def on_step(stage: str) -> None:
        bar.update(task, stage=stage)
        bar.refresh()  # each stage is shown even when it is over before the next automatic refresh

    with bar:
        task = bar.add_task(what, total=None, stage="loading the model file")
        yield on_step


def warm(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
         check: Annotated[bool, typer.Option("--check", help="Compare every output with eager PyTorch, and fail "
                                             "if the cache did not keep everything the buckets use.")] = False,
         timeout: Timeout = None, json: Json = False, trace: TraceFile = None,
         serving_plan: Annotated[Optional[Path], typer.Option(
             "--serving-plan", help="Warm exactly the buckets of a plan (hpurecipe serving-plan --json > PLAN).",
             show_default=False)] = None,
         precompile: Annotated[Optional[Path], typer.Option(
             "--precompile", help="Precompile into DIR instead (as hpurecipe precompile MODEL -o DIR).",
             show_default=False)] = None, cards: Cards = 1) -> None:
    """Compile and run every bucket of a model file once, filling the cache; write its manifest."""
    from hpu_backend.shipping.warm import warm as warm_spec

    check_trace(trace)
    if cards > 1 and (precompile is not None or serving_plan is not None):
        raise UsageError("--cards builds the model file's buckets on every rank; it takes no --precompile or "
                         "--serving-plan")
    if precompile is not None:
        return _precompile(model_file, precompile, axis, cache_dir, timeout, json, train, serving_plan, trace)
    if serving_plan is not None:
        from .servingcmd import warm_plan

        return warm_plan(model_file, serving_plan, cache_dir, timeout, json)
    with time_limit(timeout, model_file):
        spec = load_spec(model_file, axis)
        config = config_to_fill(cache_dir, "warm")
        before = _recipe_keys(config)
        try:
            with progress(cards * len(spec.points()), json) as on_point, \
                    traced(trace, on_point, "warm") as on_point, interrupt_quiet():
                report = warm_spec(spec, config, train=train, check=check, on_point=on_point, cards=cards)
        except KeyboardInterrupt:
            raise _interrupted(config, before) from None
    finish(report, config, json, check)


def _precompile(model_file, out: Path, axis, cache_dir, timeout, json: bool, *others) -> None:
    """``warm --precompile DIR``: ``precompile`` under the name a deployment looks for (inference only)."""
    from .precompilecmds import precompile

    if any(others):
        raise UsageError("--precompile captures inference over the model file's axes; it takes no --train, "
                         "--serving-plan or --trace")
    precompile(model_file, output=out, axis=axis, cache_dir=cache_dir, timeout=timeout, json=json)


def _recipe_keys(config) -> set[str]:
    """The keys of the recipes (not programs) in the cache ``config`` names."""
    cache = open_cache(config.resolved_path(), quiet=True, inspect=True)
    return set() if cache is None else {i.key for i in cache.entries() if i.meta.get("kind") != "program"}


def _interrupted(config, before: set[str]) -> typer.Exit:
    """Ctrl-C during warm: one line saying what the run left (the recipes it wrote, and whether the cache
    verifies, checked now, not assumed), exit 130 as a shell expects."""
    from hpu_backend.shipping.cachepolicy import recipe_problem

    written = len(_recipe_keys(config) - before)
    cache = open_cache(config.resolved_path(), quiet=True, inspect=True)
    bad = [] if cache is None else cache.verify(check=recipe_problem)
    state = "the cache verifies clean" if not bad else \
        f"the cache has {render.plural(len(bad), 'bad entry')}; run: hpurecipe verify --fix"
    render.err_console.print(f"interrupted: {render.plural(written, 'recipe')} written, {state}", markup=False,
                             highlight=False, soft_wrap=True)
    return typer.Exit(130)


@contextlib.contextmanager
def interrupt_quiet() -> Iterator[None]:
    """Hold back autograd's anomaly trace ("Error detected in ...", some thirty lines), which AOTAutograd prints
    when an exception passes through a backward it traces under anomaly mode: after Ctrl-C it is noise (the
    interrupt is not an error in the model). Held traces are printed when the run ends any other way."""
    held, show = [], warnings.showwarning

    def hold(message, category, filename, lineno, file=None, line=None):
        if str(message).startswith("Error detected in"):
            held.append((message, category, filename, lineno, file, line))
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = hold
    try:
        yield
    except KeyboardInterrupt:
        held.clear()
        raise
    finally:
        warnings.showwarning = show
        for args in held:
            show(*args)


def prebuild(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
             jobs: Annotated[int, typer.Option("--jobs", "-j", callback=bounded("--jobs"),
                                               help="Worker processes.")] = 1,
             json: Json = False, cards: Cards = 1) -> None:
    """Compile every bucket without running recipes (compile-only), across worker processes."""
    from hpu_backend.shipping.warm import prebuild as prebuild_spec

    if cards > 1 and jobs > 1:
        raise UsageError("--cards builds every rank in one process (ranks share what they compile); drop --jobs")
    spec = load_spec(model_file, axis)
    config = config_to_fill(cache_dir, "prebuild")
    with progress(cards * len(spec.points()), json) as on_point:
        report = prebuild_spec(spec, config, jobs=jobs, train=train, on_point=on_point, cards=cards)
    finish(report, config, json, False)


def coverage(model_file: ModelFile, cache_dir: CacheDir = None, axis: Axis = None, train: Train = False,
             precompiled: Annotated[Optional[Path], typer.Option(
                 "--precompiled", help="Check a precompiled directory's artifact ranges instead of the cache.",
                 show_default=False)] = None,
             timeout: Timeout = None, json: Json = False) -> None:
    """Which buckets have all their recipes in the cache (or an artifact in a precompiled directory); exit 1 if
    any is missing (a deployment gate)."""
    from hpu_backend.shipping.coverage import coverage as coverage_of

    if precompiled is not None:
        return _precompiled_coverage(model_file, precompiled, axis, timeout, json)
    with time_limit(timeout, model_file):
        spec = load_spec(model_file, axis)
        cache = open_cache(cache_dir, quiet=True, inspect=True)
        with progress(len(spec.points()), json) as on_point:
            report = coverage_of(spec, cache, train=train, on_point=on_point)
    if json:
        render.emit_json(report.to_dict())
    else:
        render.table(["bucket", "recipes", "missing", "status"],
                     ([r["bucket"], r["recipes"], len(r["missing"]), "missing" if r["missing"] else "ok"]
                      for r in report.points), right=("recipes", "missing"))
        render.note("{} of {} buckets covered in {}.", len(report.points) - len(report.uncovered), len(report.points),
                    config_for(cache_dir).resolved_path())
    if report.fit is not None:
        raise fail(f"{len(report.uncovered)} buckets are not fully cached because {too_small(report.fit, cache.config)}")
    if report.uncovered:
        raise fail(f"{len(report.uncovered)} buckets are not fully cached; run: hpurecipe warm {model_file}")


def _precompiled_coverage(model_file: str, directory: Path, axis, timeout, json: bool) -> None:
    from .precompilecmds import covered

    with time_limit(timeout, model_file):
        rows = covered(directory, load_spec(model_file, axis).points())
    missing = [r for r in rows if not r["artifact"]]
    if json:
        render.emit_json({"precompiled": str(directory), "points": rows, "uncovered": len(missing)})
    else:
        render.table(["bucket", "artifact", "status"], ([r["bucket"], r["artifact"] or "-",
                                                        "missing" if not r["artifact"] else "ok"] for r in rows))
        render.note("{} of {} buckets covered by {}.", len(rows) - len(missing), len(rows), directory)
    if missing:
        raise fail(f"{len(missing)} buckets are outside every precompiled range; run: hpurecipe precompile "
                   f"{model_file} -o {directory}")


DTYPE_CHOICES = ("bf16", "fp8")  # hpu_backend.planning.capacity.DTYPES, without importing torch at start-up


def analyze(model_file: ModelFile, axis: Axis = None, train: Train = False,
            target: Annotated[str, typer.Option(help=f"Device to plan for: {' or '.join(TARGETS)}.")] = TARGETS[0],
            input_len: Annotated[Optional[int], typer.Option(
                "--input-len", callback=bounded("--input-len"),
                help="Capacity planning: prompt tokens per sequence (with --output-len).",
                show_default=False)] = None,
            output_len: Annotated[Optional[int], typer.Option(
                "--output-len", callback=bounded("--output-len"),
                help="Capacity planning: generated tokens per sequence (with --input-len).",
                show_default=False)] = None,
            dtype: Annotated[Optional[str], typer.Option(
                help="Capacity planning: bf16, or fp8 (weights and matmul inputs in fp8). Default bf16.",
                show_default=False)] = None,
            batch: Annotated[Optional[int], typer.Option(
                callback=bounded("--batch"),
                help="Capacity planning: the batch for tokens/s (default: the largest that fits).",
                show_default=False)] = None,
            cards: Annotated[Optional[int], typer.Option(
                callback=bounded("--cards"),
                help="Capacity planning: tensor parallel over this many cards of one server (per-card plan; "
                     "a model file with PER_CARD).", show_default=False)] = None,
            lazy: Annotated[bool, typer.Option(
                "--lazy", help="Run the model eagerly in lazy mode (mark_step after each step) and report its "
                "lazy graphs' recipes instead of torch.compile's.")] = False,
            seq: Annotated[Optional[int], typer.Option(
                callback=bounded("--seq"), help="Training plan (with --train): tokens per sequence.",
                show_default=False)] = None,
            global_batch: Annotated[Optional[int], typer.Option(
                "--global-batch", callback=bounded("--global-batch"),
                help="Training plan: sequences per optimizer step over all cards.",
                show_default=False)] = None,
            zero: Annotated[int, typer.Option(
                callback=bounded("--zero"), help="Training plan: ZeRO stage 0-3 (3 = FSDP full sharding).")] = 0,
            tp: Annotated[int, typer.Option(
                callback=bounded("--tp"), help="Training plan: tensor-parallel cards (of --cards).")] = 1,
            bucket_mb: Annotated[float, typer.Option(
                "--bucket-mb", callback=bounded("--bucket-mb"),
                help="Training plan: DDP/ZeRO gradient bucket size in MB.")] = 25.0,
            checkpointing: Annotated[str, typer.Option(
                help="Training plan: activation checkpointing, none or full.")] = "none",
            search: Annotated[bool, typer.Option(
                "--search", help="Training plan: the fastest layout (TP, ZeRO, checkpointing) that fits.")] = False,
            timeout: Timeout = None, json: Json = False, trace: TraceFile = None) -> None:
    """Per bucket: CPU fallbacks, graph breaks, recompilations, estimated time and peak HBM; the largest batch
    that fits the target's HBM. With --input-len and --output-len (a model file with a DECODE step): the
    prefill and decode steps without weights, the largest batch and tokens/s. With --train --seq
    --global-batch: a whole training step across --cards (ZeRO, TP, buckets, checkpointing) without weights,
    per-card memory by category, the largest micro-batch and tokens/s. Reads and writes no cache."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected {' or '.join(TARGETS)}")
    problem = layout_problem(target, cards or 1, tp, global_batch)  # before any model loads
    if problem:
        raise UsageError(problem)
    if lazy and (input_len is not None or output_len is not None):
        raise UsageError("--lazy reports the lazy graphs of the model's steps; capacity planning has no lazy form")
    if seq is not None or global_batch is not None:
        if input_len is not None or output_len is not None:
            raise UsageError("--input-len/--output-len plan inference, --seq/--global-batch a training step: "
                             "give one pair")
        check_trace(trace)
        with time_limit(timeout, model_file):
            _training(model_file, axis, train, target, seq, global_batch, dtype or "bf16", batch, cards or 1, zero,
                      tp, bucket_mb, checkpointing, search, json, trace)
        return
    if input_len is None and output_len is None:
        if dtype is not None or batch is not None or cards is not None:
            raise UsageError("--dtype, --batch and --cards are for capacity planning: give --input-len and "
                             "--output-len too")
        from hpu_backend.diagnosis.analyze import analyze_spec

        from .analysis import print_analysis

        check_trace(trace)
        with time_limit(timeout, model_file):
            spec = load_spec(model_file, axis)
            with progress(len(spec.points()), json) as on_point, traced(trace, on_point, "analyze", target) as on_point:
                doc = analyze_spec(spec, target, train, on_point, lazy=lazy)
        render.emit_json(doc) if json else print_analysis(doc)
        return
    check_trace(trace)
    with time_limit(timeout, model_file):
        _capacity(model_file, axis, train, target, input_len, output_len, dtype or "bf16", batch, cards, json, trace)


def advise(model_file: ModelFile, axis: Axis = None, train: Train = False,
           target: Annotated[str, typer.Option(help=f"Device to plan for: {' or '.join(TARGETS)}.")] = TARGETS[0],
           json: Json = False) -> None:
    """The Gaudi optimization checklist over the model file: CPU fallbacks, host syncs and graph breaks,
    recompiles and their causes, hand-written attention, autocast, unfused optimizers and clipping, batch size,
    HPU Graphs; each finding with its source line, why it matters and the estimated gain, most valuable first.
    Reads and writes no cache."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected {' or '.join(TARGETS)}")
    from hpu_backend.diagnosis.advise import advise as run_advise

    from .analysis import print_advice

    with stages("advise", json) as on_step:
        doc = run_advise(load_spec(model_file, axis), train, target, on_step=on_step)
    render.emit_json(doc) if json else print_advice(doc)


def _capacity(model_file: str, axis, train: bool, target: str, input_len: int | None, output_len: int | None,
              dtype: str, batch: int | None, cards: int | None, json: bool, trace=None) -> None:
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
    from hpu_backend.planning.capacity import capacity

    from .analysis import print_capacity

    with stages("capacity plan", json) as on_step:
        doc = capacity(load_spec(model_file, None), target, dtype, input_len, output_len, batch, cards,
                       str(trace) if trace else None, on_step=on_step)
    render.emit_json(doc) if json else print_capacity(doc)


def _training(model_file: str, axis, train: bool, target: str, seq: int | None, global_batch: int | None,
              dtype: str, batch: int | None, cards: int, zero: int, tp: int, bucket_mb: float, checkpointing: str,
              search: bool, json: bool, trace=None) -> None:
    if not train or seq is None or global_batch is None or axis:
        raise UsageError("a training plan needs --train, --seq and --global-batch (and no --axis), e.g. --train "
                         "--seq 4096 --global-batch 1024 --cards 8 --zero 1")
    if dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {dtype!r}: expected {' or '.join(DTYPE_CHOICES)}")
    from hpu_backend.planning.training_plan import plan_training

    from .analysis import print_training

    with stages("training plan", json) as on_step:
        doc = plan_training(load_spec(model_file, None), target, dtype, seq, global_batch, cards, zero, tp,
                            bucket_mb, checkpointing, batch, search, on_step=on_step,
                            trace=str(trace) if trace else None)
    render.emit_json(doc) if json else print_training(doc)
