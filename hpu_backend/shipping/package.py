"""Build a recipe package from a model file: torch.export over the file's axes, one recipe per bucket.

Why torch.export rather than the Dynamo graphs: a package must serve without Dynamo, so it needs one
whole-model graph whose inputs are named (parameters, buffers, constants, user inputs) and whose
call layout is a pytree spec — exactly what an ExportedProgram is. Each varying input dimension is
matched to the model file's axis whose values it follows across the points (a shared ``Dim``, so
inputs that share an axis share a symbol), from 1 (or the smallest size the model takes) up to the top
of the largest value's bucket. The exported graph is decomposed with the HPU table, lowered once (graph
passes), then lowered for the bucket of every point (bucket passes) — the same passes and recipes as
``torch.compile(backend="hpu_backend")``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram

from ..capture.exported import decompose, graph_inputs, lower_exported
from ..errors import first_line
from ..lowering import LoweringContext, LoweringError, constant_of
from ..modelfiles.modelspec import ModelSpec, check_eager, point_label, quiet_trace_logs
from recipecache.signing import signing_key

from ..formats.package import GraphInput, Package, PackageError, check_destination, toolchain
from ..runtime.packaged import layout_of, load_package
from ..formats.recipe import Constant, Recipe
from ..serve.session import Session
from ..settings import Settings

@dataclass
class PackageReport:
    """What ``build_package`` wrote and checked."""

    path: str
    model: str
    size_bytes: int
    symbols: dict[str, str]  # symbol -> "input dim" it is read from
    ranges: dict[str, list[int]]
    buckets: list[dict[str, Any]]  # {"bucket": {...}, "points": [...]}
    with_weights: bool
    checked: list[str] = field(default_factory=list)  # points compared with eager
    seconds: float = 0.0
    signed: bool = False  # signed with HPURECIPE_BUNDLE_KEY


def build_package(spec: ModelSpec, out: str | os.PathLike, *, with_weights: bool = False,
                  check: bool = True) -> PackageReport:
    """Export ``spec``'s model over its axes, lower one recipe per bucket and write the package to ``out``.

    With ``check``, the written package is loaded back and compared with eager at every point.
    PackageError (one line) if the model cannot be exported or lowered, or ``out`` exists and is not a
    regular file. With ``HPURECIPE_BUNDLE_KEY`` set, the package is signed with it.
    """
    check_destination(out)
    start = time.perf_counter()
    session = Session(Settings.from_options({**spec.options, "model": spec.name}))  # the package holds the recipes
    settings = session.settings
    model = spec.build_model().eval()
    examples = [spec.split(spec.inputs(p)) for p in spec.points()]
    with torch.no_grad():
        ep = decompose(export_model(model, examples, spec, settings))
    template, ctx = lower_exported(ep, settings, f"{spec.name}_package")
    inputs = _tied_to_first_name(graph_inputs(ep), model)
    recipes, points = _bucket_recipes(session, template, ctx, inputs, examples, spec)
    package = Package(
        model=spec.name, toolchain=toolchain(), inputs=inputs,
        in_spec=layout_of(ep.call_spec.in_spec, "arguments"),
        out_spec=layout_of(ep.call_spec.out_spec, "result"),
        ranges=_ranges(ep, template), recipes=recipes,
        constants={name: constant_of(t) for name, t in ep.constants.items() if isinstance(t, torch.Tensor)},
        weights=_weights(ep, inputs) if with_weights else {},
        axes=spec.axes)
    package.check()
    key = signing_key()
    path = Path(out)
    with _staged(path, package.to_bytes(key)) as staged:
        checked = _check(staged, None if with_weights else model, model, examples, spec) if check else []
        size = staged.stat().st_size
    report = PackageReport(
        path=str(path), model=spec.name, size_bytes=size, checked=checked,
        symbols={s: f"{inputs[slot].target} dim {dim}" for s, (slot, dim) in
                 zip(template.symbols, template.symbol_sources)},
        ranges=package.ranges, with_weights=with_weights, signed=key is not None,
        buckets=[{"bucket": r.bucket, "points": ps} for r, ps in zip(recipes, points)])
    report.seconds = time.perf_counter() - start
    return report


def export_model(model: torch.nn.Module, examples: list[tuple], spec: ModelSpec,
                 settings: Settings) -> ExportedProgram:
    """torch.export at the last point, each varying dimension dynamic along its axis (the last point
    has the largest sizes when axes list them in order; a size of 1 would make export specialize).

    Each dimension ranges from 1 up to the top of its largest value's bucket, so the package serves every
    size of the buckets it holds. Where the model's code needs narrower bounds (a strided convolution
    needs a smallest image), the bounds shrink to the buckets of the points, then to the points
    themselves; the model file's ``AXES_MIN`` sets an axis's smallest size outright. PackageError with
    torch's whole reason if no bounds export.
    """
    layout, varying = _varying_dims(examples, spec)
    error: Exception | None = None
    for bounds in _candidate_bounds(varying, spec, settings):
        try:
            dims = {name: Dim(name, min=lo, max=hi) for name, (lo, hi) in bounds.items()}
            shapes = tuple({d: dims[name] for d, name in per_dim.items()} or None for per_dim in layout)
            with quiet_trace_logs():
                return torch.export.export(model, examples[-1], dynamic_shapes=shapes, strict=False)
        except Exception as e:  # export reports unsupported Python, data-dependent shapes, violated constraints
            error = e
            if not _bounds_violated(e):
                break  # narrower bounds cannot help
    check_eager(spec.path, f"the model at {point_label(spec.points()[-1])}", model, *examples[-1])  # its own error
    tried = ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in bounds.items()) or "static shapes"
    reason = str(error).strip() or type(error).__name__
    raise PackageError(
        f"{spec.path}: torch.export cannot export the model over its axes (narrowest bounds tried: {tried}):\n"
        f"{reason}\n"
        f"To fix: list in AXES only sizes the model takes, or give an axis its smallest size in the model file "
        f"(AXES_MIN = {{\"{next(iter(bounds), 'axis')}\": N}}, as torch's suggested fixes above say).")


def _bounds_violated(e: Exception) -> bool:
    """Whether torch.export refused the dimensions' bounds (the model needs narrower ones)."""
    from torch._dynamo.exc import UserError, UserErrorType

    return isinstance(e, UserError) and e.error_type in (UserErrorType.CONSTRAINT_VIOLATION,
                                                         UserErrorType.DYNAMIC_DIM)


def _varying_dims(examples: list[tuple], spec: ModelSpec) -> tuple[list[dict[int, str]], dict[str, list[int]]]:
    """Per input, ``{dim: name}`` for each dimension whose size changes across the points (named after the
    axis whose values it follows), and each name's sizes, in order of first appearance (= s0, s1, ...)."""
    points = spec.points()
    varying: dict[str, list[int]] = {}
    layout = []
    for i, value in enumerate(examples[0]):
        per_dim = {}
        for d in range(value.dim() if isinstance(value, torch.Tensor) else 0):
            sizes = [ex[i].shape[d] for ex in examples]
            if len(set(sizes)) > 1:
                axis = next((a for a in spec.axes if [p[a] for p in points] == sizes), f"input{i}_dim{d}")
                varying.setdefault(axis, sizes)
                per_dim[d] = axis
        layout.append(per_dim)
    return layout, varying


def _candidate_bounds(varying: dict[str, list[int]], spec: ModelSpec,
                      settings: Settings) -> Iterator[dict[str, tuple[int, int]]]:
    """Each dimension's (min, max) to export with, widest first: from 1, from the bottom of the smallest
    point's bucket, from the smallest point; each up to the top of the largest point's bucket, then up to
    the largest point. ``spec.axes_min`` fixes an axis's min."""
    policies = dict(zip(varying, settings.bucket_policies([f"s{k}" for k in range(len(varying))])))
    lows = {name: [1, max(1, policies[name].bucket(min(sizes))[0]), min(sizes)] for name, sizes in varying.items()}
    highs = {name: [policies[name].bucket(max(sizes))[1], max(sizes)] for name, sizes in varying.items()}
    tried = []
    for low, high in itertools.product(range(3), range(2)):
        bounds = {name: (spec.axes_min.get(name, lows[name][low]), highs[name][high]) for name in varying}
        if bounds not in tried:
            tried.append(bounds)
            yield bounds


def _ranges(ep: ExportedProgram, template: Recipe) -> dict[str, list[int]]:
    """Each recipe symbol's range as export proved it (the model file's axes bound it above)."""
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    ranges = {}
    for sym, (slot, dim) in zip(template.symbols, template.symbol_sources):
        expr = placeholders[slot].meta["val"].shape[dim].node.expr
        vr = ep.range_constraints[expr]
        ranges[sym] = [int(vr.lower), int(vr.upper)]
    return ranges


def _bucket_recipes(session: Session, template: Recipe, ctx: LoweringContext, inputs: list[GraphInput],
                    examples: list[tuple], spec: ModelSpec) -> tuple[list[Recipe], list[list[str]]]:
    """One recipe per distinct bucket of the points, and the points each covers."""
    values = []
    for example in examples:
        flat = pytree.tree_leaves((example, {}))
        values.append(tuple(flat[inputs[slot].index].shape[dim] for slot, dim in template.symbol_sources))
    per_point = session.buckets(template.symbols, values)
    distinct = [b for i, b in enumerate(per_point) if b not in per_point[:i]]
    recipes, lowered = [], session.recipes(template, ctx, distinct)
    for bucket in distinct:
        try:
            recipes.append(next(lowered))
        except LoweringError as e:
            raise PackageError(f"{spec.name}: bucket {bucket} cannot be lowered: {e.reason}") from None
    labels = [point_label(p) for p in spec.points()]
    return recipes, [[label for label, b in zip(labels, per_point) if b == bucket] for bucket in distinct]


def _check(path: Path, weights_from: torch.nn.Module | None, model: torch.nn.Module, examples: list[tuple],
           spec: ModelSpec) -> list[str]:
    """Load the written package and compare it with eager at every point."""
    served = load_package(path, weights_from)
    checked = []
    with torch.no_grad():
        for point, example in zip(spec.points(), examples):
            try:
                torch.testing.assert_close(served(*example), model(*example))
            except AssertionError as e:
                raise PackageError(f"{spec.name} at {point_label(point)}: the package does not match eager: "
                                   f"{first_line(e)}") from None
            checked.append(point_label(point))
    return checked


@contextlib.contextmanager
def _staged(path: Path, data: bytes) -> Iterator[Path]:
    """A temporary file holding ``data`` in ``path``'s directory, renamed to ``path`` when the block succeeds
    and removed when it fails: a failed check or write leaves no package behind; never over a device or FIFO."""
    check_destination(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise PackageError(f"{path}: cannot write the package: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _tied_to_first_name(inputs: list[GraphInput], model: torch.nn.Module) -> list[GraphInput]:
    """Each parameter or buffer named as ``named_parameters()``/``named_buffers()`` name it: a tensor shared
    under several names (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) is listed once, under its
    first name, so the loader finds it in any copy of the model and a package stores it once."""
    first: dict[str, str] = {}
    for named in (model.named_parameters, model.named_buffers):
        seen: dict[int, str] = {}
        for name, tensor in named(remove_duplicate=False):
            first[name] = seen.setdefault(id(tensor), name)
    return [dataclasses.replace(gi, target=first.get(gi.target, gi.target)) if gi.kind in ("parameter", "buffer")
            else gi for gi in inputs]


def _weights(ep: ExportedProgram, inputs: list[GraphInput]) -> dict[str, Constant]:
    """The parameters and buffers the graph reads, once per tensor (``--with-weights``)."""
    state = {**ep.constants, **ep.state_dict}  # non-persistent buffers are among the constants
    return {gi.target: constant_of(state[gi.target]) for gi in inputs if gi.kind in ("parameter", "buffer")}
