"""Warm-up: run a compiled model once per shape point of a model spec, recording which recipes each point uses.

``warmup(compiled_model, spec)`` is for a serving process: at start-up it takes every bucket's
recipes into the process (from the disk cache, or compiled if missing), so serving compiles
nothing. ``warm`` and ``prebuild`` are the drivers behind ``hpurecipe warm`` / ``prebuild``: they
compile the spec's model against one cache directory, in this process or across worker processes,
and write a manifest (model → point → recipe keys) next to the cache's entries. With ``cards``, they build
every rank of a tensor-parallel deployment in this process (``warm_ranks``): ranks whose graphs are identical
share one compile.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.utils._pytree as pytree

from recipecache import CacheConfig
from recipecache.remote import redact_url

from .. import metrics
from ..serve.session import Event, Session, listen
from ..settings import Settings
from .cachefit import cache_fit
from .manifests import manifest, send_manifest, write_manifest
from ..modelfiles.modelfile import load_model_file
from ..modelfiles.modelspec import ModelFileError, ModelSpec, model_call, point_label, spec_from, user_call
from .reports import PointResult, UsedRecipe, WarmReport


def _tracked(fn: Callable[[], Any]) -> tuple[Any, list[UsedRecipe], list[str], list[str]]:
    """``fn()``, the recipes it used, the keys of the programs it used and why the cache missed entries it holds
    under another key (one line per miss: "fx_graph_0001_fw: torch 2.13.0 → 2.13.1"), from the events graphs emit.

    Dynamo may serve a point with graphs compiled long before (by an earlier warm-up, or by the server
    itself); their ``use`` events name the recipes they run.
    """
    used: dict[int, UsedRecipe] = {}
    programs: set[str] = set()
    missed: list[str] = []

    def on_event(e: Event):
        if e.recipe is not None and (id(e.recipe) not in used or e.kind == "use"):
            before = used.get(id(e.recipe))
            why = e.compiled_for or (before.compiled_for if before else "")
            used[id(e.recipe)] = UsedRecipe(e.graph, e.recipe, e.key, dict(e.env or {}), why)
        if e.program:
            programs.add(e.program)
        if e.missed:
            missed.append(f"{e.graph or 'program ' + (e.program or '')[:12]}: {'; '.join(e.missed)}")

    with listen(on_event):
        out = fn()
    return out, list(used.values()), sorted(programs), missed


def keys_of(used: list[UsedRecipe]) -> list[str]:
    return sorted({u.key for u in used if u.key})


def fallback_ops(used: list[UsedRecipe]) -> list[str]:
    """The ops the recipes run on the CPU instead of the device, as their placement recorded them."""
    return sorted({fb["op"] for u in used for fb in u.recipe.facts.get("placement", {}).get("fallbacks", [])})


def run_points(compiled: Callable, spec: ModelSpec, points: Iterable[Mapping[str, int]], *,
               train: bool = False, eager: torch.nn.Module | None = None,
               on_point: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Call ``compiled`` once per point (forward, or forward + loss + backward with ``train``).

    With ``eager`` given, each point's output (and loss) is compared with the eager module's.
    """
    if train:
        spec.require_loss()
    results = []
    for point in points:
        result = _run_point(compiled, spec, dict(point), train, eager)
        results.append(result)
        if on_point is not None:
            on_point(result)
    return results


def _run_point(compiled, spec, point, train, eager) -> PointResult:
    inputs = spec.inputs(point)
    start = time.perf_counter()
    with metrics.metric_localcontext("graph_compilation") as gc:
        out, used, programs, missed = _tracked(lambda: _run_model(compiled, spec, inputs, train, point))
    built = dict(gc.stats())["TotalNumber"]
    result = PointResult(point, keys_of(used), built, max(len(used) - built, 0), time.perf_counter() - start,
                         programs=programs, fallback_ops=fallback_ops(used), used=used, missed=missed)
    if eager is not None:
        _compare(result, out, _run_model(eager, spec, inputs, train, point))
    return result


def _run_model(model: Callable, spec: ModelSpec, inputs: tuple, train: bool, point: Mapping[str, int]):
    """The model's output at one point (with ``train``: (output, loss) after the backward pass), detached.

    Only the model file's code is wrapped as its failure (user_call); the output may be any pytree
    (a tensor, tuple, dict or Hugging Face ModelOutput)."""
    torch.manual_seed(0)  # the same dropout masks for the compiled model and eager
    where = f"the model at {point_label(point)}"
    if not train:
        with torch.no_grad():
            out = model_call(spec.path, where, model, *spec.split(inputs))
        _end_lazy_step()
        return out
    output = model_call(spec.path, where, model, *spec.split(inputs))
    loss = spec.loss_of(output, inputs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ModelFileError(f"{spec.path}: loss() must return a one-element tensor, got "
                             f"{type(loss).__name__}{list(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    user_call(spec.path, f"the backward pass at {point_label(point)}", loss.backward)
    _end_lazy_step()
    return _tensors(output), loss.detach()


def _end_lazy_step() -> None:
    """In lazy mode (``plan_lazy``, or the device in lazy mode), run the step's graph here, inside the point."""
    from ..device import context

    if context.is_lazy():
        context.mark_step()


def _compare(result: PointResult, got: Any, want: Any) -> None:
    got_t, want_t = _tensors(got), _tensors(want)
    try:
        torch.testing.assert_close(got_t, want_t)
    except AssertionError as e:
        result.check_error = str(e).strip().splitlines()[0]
    diffs = [(g.double() - w.double()).abs().max().item() for g, w in zip(got_t, want_t)
             if g.shape == w.shape and g.numel()]
    result.max_abs_diff = max(diffs, default=0.0)


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of any pytree of outputs (registered containers, and other mappings and sequences), detached."""
    if isinstance(value, torch.Tensor):
        return [value.detach()]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    leaves = pytree.tree_leaves(value)
    return [] if len(leaves) == 1 and leaves[0] is value else _tensors(leaves)


def as_spec(spec: Any) -> ModelSpec:
    """A ModelSpec from a spec, a model-file selector, or an object/module/dict holding the model-file names."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return load_model_file(spec)
    return spec_from(spec, getattr(spec, "__name__", type(spec).__name__))


def warmup(compiled_model: Callable, spec: Any, *, train: bool = False,
           axes: Mapping[str, list[int]] | None = None) -> WarmReport:
    """Run ``compiled_model`` once per shape point of ``spec`` so that serving compiles nothing.

    Call it at a server's start-up: every bucket's recipes are taken into this process from the
    disk cache (or compiled, if the cache lacks them; the report counts both). ``spec`` is a
    ModelSpec, a model file path (``models/gpt.py``), or anything holding ``make_inputs`` and
    ``AXES`` (a module, namespace or dict); ``axes`` overrides some of its axes.
    """
    spec = as_spec(spec)
    if axes:
        spec = spec.with_axes(axes)
    start = time.perf_counter()
    points = run_points(compiled_model, spec, spec.points(), train=train)
    return WarmReport(spec.name, _mode(train), points, time.perf_counter() - start)


def compile_spec(spec: ModelSpec, cache_config: CacheConfig | None, *, execute: bool = True, cache: bool = True,
                 train: bool = False) -> tuple[torch.nn.Module, Callable]:
    """(eager model, compiled model) for a spec, against one cache configuration (None: the defaults)."""
    model = spec.build_model()
    model.train(train)
    kwargs = {} if spec.dynamic is None else {"dynamic": spec.dynamic}
    options = _options(spec, cache_config, execute=execute, cache=cache)
    return model, torch.compile(model, backend="hpu_backend", options=options, **kwargs)


def _options(spec: ModelSpec, cache_config: CacheConfig | None, *, execute: bool = True, cache: bool = True) -> dict:
    return dict(spec.options, model=spec.name, cache_config=cache_config, execute=execute, cache=cache)


def open_session(spec: ModelSpec, cache_config: CacheConfig | None, *, execute: bool = True) -> Session:
    """The session a warm-up or prebuild of ``spec`` compiles in: its settings, over the store they ask for."""
    options = _options(spec, cache_config, execute=execute)
    return Session.open(Settings.from_options(options))


def warm(spec: ModelSpec, cache_config: CacheConfig | None, *, train: bool = False, check: bool = False,
         execute: bool = True, on_point: Callable[[PointResult], None] | None = None,
         points: list[dict] | None = None, cards: int = 1) -> WarmReport:
    """Compile and run every point of ``spec`` (or the ``points`` given: a serving plan's buckets) in this process,
    filling the cache; then flush it to disk, check that the cache kept what the points use, write the manifest
    and send it to the fleet tier if there is one. ``cards`` > 1: every rank of a tensor-parallel deployment
    over that many cards (``warm_ranks``)."""
    if cards > 1:
        if points is not None:
            raise ValueError("warm over cards covers the model file's axes; it takes no points")
        return warm_ranks(spec, cache_config, cards, train=train, check=check, execute=execute, on_point=on_point)
    start = time.perf_counter()
    session = open_session(spec, cache_config, execute=execute)
    model, compiled = compile_spec(spec, cache_config, execute=execute, train=train)
    eager = model if check else None
    with session.use():
        try:
            points = run_points(compiled, spec, points or spec.points(), train=train, eager=eager, on_point=on_point)
        except KeyboardInterrupt:
            session.flush()  # the recipes compiled so far land whole, so the cache an interrupt leaves verifies
            raise
    return _recorded(WarmReport(spec.name, _mode(train), points, time.perf_counter() - start), spec, session)


# -- every rank of a tensor-parallel deployment --------------------------------------------------------------

def warm_ranks(spec: ModelSpec, cache_config: CacheConfig | None, cards: int, *, train: bool = False,
               check: bool = False, execute: bool = True,
               on_point: Callable[[PointResult], None] | None = None) -> WarmReport:
    """Every point of every rank of ``spec``'s tensor-parallel shard over ``cards`` (its ``PER_CARD``), one rank
    after another in this process, against one cache. Each rank's graphs are traced as that rank sees itself
    (``as_rank``), so a graph that depends on the rank is traced as it will run there, under its own key; ranks
    whose graphs are identical have identical keys, and all but the first hit what the first compiled. Each
    point's result names its rank; the manifest lists, per point, the entries of every rank."""
    start, results, session, card = time.perf_counter(), [], None, None
    try:
        for rank in range(cards):
            with as_rank(rank, cards) as group:
                card = card_spec(spec, cards, group)
                session = session or open_session(card, cache_config, execute=execute)
                model, compiled = compile_spec(card, cache_config, execute=execute, train=train)
                with session.use():
                    results += run_points(compiled, card, card.points(), train=train, eager=model if check else None,
                                          on_point=_ranked(rank, on_point))
    except KeyboardInterrupt:
        if session is not None:
            session.flush()  # the recipes compiled so far land whole
        raise
    report = WarmReport(card.name, _mode(train), results, time.perf_counter() - start, cards=cards)
    return _recorded(report, card, session)


def _ranked(rank: int, on_point: Callable[[PointResult], None] | None) -> Callable[[PointResult], None]:
    def tag(result: PointResult) -> None:
        result.rank = rank
        if on_point is not None:
            on_point(result)
    return tag


def card_spec(spec: ModelSpec, cards: int, group: str) -> ModelSpec:
    """One card's shard of ``spec`` over ``cards`` (the model file's ``PER_CARD``), its collectives over the
    process group named ``group``, covering ``spec``'s axes. A deployment script builds its rank's model from it
    exactly so, with its own group's name, to meet the recipes ``warm --cards`` built."""
    if spec.per_card is None:
        raise ModelFileError(f"{spec.path}: building for {cards} cards needs PER_CARD(cards, group, layers) in the "
                             "model file (one card's tensor-parallel shard, see models/llama.py)")
    holder = user_call(spec.path, f"PER_CARD(cards={cards})", spec.per_card, cards=cards, group=group, layers=None)
    return spec_from(holder, f"{spec.path}:PER_CARD").with_axes(spec.axes)


@contextlib.contextmanager
def as_rank(rank: int, cards: int):
    """This process as rank ``rank`` of ``cards`` on one host, for tracing: torchrun's variables, and a default
    process group of ``cards`` from torch's ``fake`` backend (its collectives move no data, so one process can
    be any rank); yields the group's name, which a launched rank's world group has too ("0"). Dynamo forgets
    its graphs on the way in and out, so no rank's trace serves another's. RuntimeError when this process
    has a process group already (it would be replaced)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("building ranks in this process needs it to have no process group of its own; "
                           "call it before init_process_group, or run `hpurecipe warm --cards` in a process of its own")
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": cards, "LOCAL_WORLD_SIZE": cards}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update({name: str(value) for name, value in env.items()})
    torch._dynamo.reset()
    try:
        dist.init_process_group("fake", rank=rank, world_size=cards)
        yield dist.group.WORLD.group_name
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch._dynamo.reset()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _recorded(report: WarmReport, spec: ModelSpec, session: Session) -> WarmReport:
    """The report, once the cache is flushed: whether the cache kept what its points use, and the manifest
    written into the cache and sent to its fleet tier (failures to do so are warnings: the run is fine)."""
    cache = session.store.flush()
    if cache.config.limit_bytes == 0:  # no cache was asked for (a cache that could not be written is reported)
        return report
    report.fit = cache_fit(report, cache)
    doc = manifest(report, spec)
    if cache.config.remote and not send_manifest(cache, doc):  # so that other hosts pull just these keys
        report.warnings.append(f"could not send the manifest to {redact_url(cache.config.remote)}; hosts will "
                               "compile to learn the keys")
    try:
        report.manifest = str(write_manifest(cache.config.resolved_path(), doc))
    except OSError as e:  # a read-only or full cache: the run itself is fine, only its record is missing
        report.warnings.append(f"cannot write the manifest ({e.strerror or e}); recipes that could be stored are in "
                               "the cache, but coverage and export will not know this run")
    return report


def plan(spec: ModelSpec, *, train: bool = False, target: str | None = None, repeat: int = 1,
         on_point: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Each point's recipes and keys from a compile-only run that reads and writes no cache (coverage, analyze);
    ``repeat`` runs each point that many times in a row (a steady loop compiles nothing after its first step)."""
    if target is not None:
        spec = ModelSpec(**{**spec.__dict__, "options": dict(spec.options, target=target)})
    _, compiled = compile_spec(spec, None, execute=False, cache=False, train=train)
    return run_points(compiled, spec, [p for p in spec.points() for _ in range(repeat)], train=train,
                      on_point=on_point)


def plan_lazy(spec: ModelSpec, *, train: bool = False, target: str | None = None,
              on_point: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Each point's recipes from running the model file eagerly in lazy mode (``mark_step()`` after each step),
    reading and writing no cache: what Gaudi's default mode makes of the model."""
    from ..device.context import lazy

    options = dict(spec.options, cache=False, **({"target": target} if target else {}))
    model = spec.build_model().train(train)
    with lazy(options):
        return run_points(model, spec, spec.points(), train=train, on_point=on_point)


# -- prebuild across processes ---------------------------------------------------------------------------

def _prebuild_chunk(selector: str, axes: dict, cache_config: CacheConfig | None, train: bool,
                    points: list[dict]) -> list[dict]:
    """Worker: a compile-only run over some points, flushed to disk before it returns."""
    spec = load_model_file(selector).with_axes(axes)
    session = open_session(spec, cache_config, execute=False)
    _, compiled = compile_spec(spec, cache_config, execute=False, train=train)
    with session.use():
        results = run_points(compiled, spec, points, train=train)
    session.flush()
    return [r.to_dict() for r in results]


def chunks(points: list, jobs: int) -> list[list]:
    """Contiguous slices: points that differ only in the inner axes mostly share Dynamo graphs, so keeping
    them in one worker traces each graph once instead of once per worker."""
    n = min(jobs, len(points))
    return [points[i * len(points) // n:(i + 1) * len(points) // n] for i in range(n)]


def prebuild(spec: ModelSpec, cache_config: CacheConfig | None, *, jobs: int = 1, train: bool = False,
             on_point: Callable[[PointResult], None] | None = None, cards: int = 1) -> WarmReport:
    """Compile every point without executing recipes, across ``jobs`` worker processes; ``cards`` > 1: every
    rank of a tensor-parallel deployment, in this process (``warm_ranks``: ranks share what they compile)."""
    if cards > 1 and jobs > 1:
        raise ValueError("building for several cards runs every rank in one process, so that ranks share what "
                         "they compile: give one job")
    if jobs <= 1:
        return warm(spec, cache_config, train=train, execute=False, on_point=on_point, cards=cards)
    start, parts = time.perf_counter(), chunks(spec.points(), jobs)
    done: dict[int, list[PointResult]] = {}
    with ProcessPoolExecutor(len(parts), mp_context=_start_method()) as pool:
        futures = {pool.submit(_prebuild_chunk, spec.path, spec.axes, cache_config, train, part): i
                   for i, part in enumerate(parts)}
        for future in as_completed(futures):
            done[futures[future]] = [PointResult(**r) for r in future.result()]
            for result in done[futures[future]]:
                if on_point is not None:
                    on_point(result)
    ordered = [r for i in range(len(parts)) for r in done[i]]
    report = WarmReport(spec.name, _mode(train), ordered, time.perf_counter() - start)
    return _recorded(report, spec, open_session(spec, cache_config, execute=False))


def _start_method():
    """fork (no second import of torch) from a single-threaded Linux process, else spawn, which is always safe."""
    import multiprocessing
    import sys
    import threading

    fork_ok = sys.platform == "linux" and threading.active_count() == 1
    return multiprocessing.get_context("fork" if fork_ok else "spawn")


def _mode(train: bool) -> str:
    return "train" if train else "inference"
