"""The torch.compile entry point: Dynamo graph → stored program (hit), or AOTAutograd → lowering (miss).

``hpu_backend`` is registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="hpu_backend")`` needs no import of ours. A graph that cannot be
lowered runs eagerly after one warning, unless strict mode asks for the error instead.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import time
from typing import Any

import torch
from torch._dynamo.exc import TensorifyScalarRestartAnalysis
from torch._dynamo.symbolic_convert import TensorifyState

from . import metrics
from .lowering import LoweringContext, LoweringError
from .serve.compiled import CompiledGraph, Replay, boxed
from .serve import recompiles
from .serve.keys import ProgramKey, Unkeyable, program_key
from .serve.programs import DRIFT, Recorder, drifted, finish_restart, note_restart, restart_program, serve
from .serve.precompiled import PrecompiledGraph
from .serve.session import Event, Session, emit, session_for
from .settings import Settings

log = logging.getLogger(__name__)

_graph_ids = itertools.count()
_SUFFIX = {"forward": "fw", "backward": "bw", "inference": "inf"}
MODES = (None, "default", "reduce-overhead")  # torch.compile modes this backend implements


class _ProfilerRangesDropped(logging.Filter):
    """Drops Dynamo's "Profiler record function ... will be ignored": every optimizer step and DDP forward opens
    a profiler range, Dynamo leaves it out of the graph it compiles, and the warning names nothing the user's
    code can change. Other records of those loggers pass."""

    MESSAGES = ("Profiler record function %s will be ignored", "Profiler function %s will be ignored")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.MESSAGES


for _logger in ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch"):
    logging.getLogger(_logger).addFilter(_ProfilerRangesDropped())


def hpu_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, **kwargs: Any):
    """Dynamo backend: serve ``gm`` from its stored program, or lower its AOTAutograd graphs to recipes, in the
    session in use (``Session.use``) or the process's.

    ``mode="reduce-overhead"`` replays inference graphs as HPU Graphs do (``compiled.Replay``).
    """
    settings = Settings.from_options(options)
    _warn_hpu_autocast(example_inputs)
    replay = _mode(kwargs.get("mode"))
    graph_id = next(_graph_ids)
    reason = _compile_reason(settings)
    name_of = functools.partial(_graph_name, graph_id)
    session = session_for(settings)
    pkey = _program_key(gm, example_inputs, settings, name_of("program"))
    if pkey is not None:
        served = _serve(pkey, session, gm, example_inputs, name_of, reason, replay)
        if served is not None:
            finish_restart(pkey.key, gm)  # the second trace of a restart: its first graph names this program
            return PrecompiledGraph(served.call, settings, pkey.key, served)
    recorder = None if pkey is None else Recorder(pkey, session, name_of("program"))
    compiled = _trace(gm, example_inputs, name_of, session, reason, recorder, replay)
    finish_restart(pkey.key if recorder is not None and recorder.program is not None else None, gm)
    return PrecompiledGraph(compiled, settings, None if pkey is None else pkey.key, recorder,
                            "" if pkey is not None else "its Dynamo graph cannot be keyed")


def _trace(gm, example_inputs: list, name_of, session: Session, reason: str, recorder: Recorder | None,
           replay: bool):
    """A miss: AOTAutograd traces the Dynamo graph and our compilers lower its graphs (the recorder stores the
    program)."""
    inner = [0.0]  # seconds spent in our compilers, to tell AOTAutograd's own time apart
    labels = input_labels(gm)  # what the user calls each input, for ``show``

    def compiler(kind: str):
        return functools.partial(_compile_graph, kind=kind, name=name_of(kind), session=session,
                                 reason=reason, recorder=recorder, inner=inner, labels=labels)

    from torch._dynamo.backends.common import aot_autograd  # a miss only: a hit never imports AOTAutograd

    from .capture.decompositions import hpu_decompositions

    start = time.perf_counter()
    specialized = set(TensorifyState.force_specializations)
    try:
        with _no_autograd_cache():
            compiled = aot_autograd(
                fw_compiler=compiler("forward"),
                bw_compiler=compiler("backward"),
                inference_compiler=compiler("inference"),
                decompositions=hpu_decompositions(),
                keep_inference_input_mutations=True,
            )(gm, example_inputs)
        replayable = replay and recorder is not None and recorder.replayable()
        return Replay(recorder.graphs["inference"], example_inputs, compiled) if replayable else compiled
    except TensorifyScalarRestartAnalysis:
        # AOTAutograd's float pass asks Dynamo to trace again with some floats specialized: store that answer
        # (after the second trace, naming its program), so that a later process need not trace to find it out.
        if recorder is not None:
            program = restart_program(list(TensorifyState.force_specializations - specialized))
            note_restart(recorder.pkey, program, gm, example_inputs, session, name_of("program"))
        raise
    finally:
        metrics.record_phase("aot_trace", time.perf_counter() - start - inner[0])


def _no_autograd_cache():
    """AOTAutograd's own cache off: it stores Inductor's output code, and ``aot_compile`` forces it on (strictly),
    so that it would fail on our graphs; our programs are what a later process reuses."""
    return torch._functorch.config.patch(enable_autograd_cache=False, force_autograd_cache=False,
                                         strict_autograd_cache=False, bundled_autograd_cache=False)


_warned_modes: set = set()


def _mode(mode: str | None) -> bool:
    """Whether ``mode`` asks for graph replay; a mode this backend does not implement is named once."""
    if mode not in MODES and mode not in _warned_modes:
        _warned_modes.add(mode)
        log.warning("hpu_backend: torch.compile mode=%r is ignored (hpu_backend knows 'default' and "
                    "'reduce-overhead'); compiling with the default mode", mode)
    return mode == "reduce-overhead"


_warned_autocast = [False]


def _warn_hpu_autocast(example_inputs: list) -> None:
    """``torch.autocast(device_type="hpu")`` casts nothing on host tensors: say so once, with the fix (not for
    tensors of the hpu device, ``hpu_backend.device``, where autocast applies Gaudi's lists)."""
    if _warned_autocast[0] or not torch.is_autocast_enabled("hpu"):
        return
    if any(isinstance(t, torch.Tensor) and t.device.type == "hpu" for t in example_inputs):
        return
    _warned_autocast[0] = True
    log.warning("hpu_backend: torch.autocast(device_type=\"hpu\") casts nothing on the simulated device (its "
                "tensors are host tensors); use hpu_backend.gaudi.autocast(), which applies Gaudi's bf16 lists")


def _program_key(gm, example_inputs, settings: Settings, name: str) -> ProgramKey | None:
    start = time.perf_counter()
    try:
        return program_key(gm, example_inputs, settings)
    except Unkeyable as e:
        log.info("hpu_backend: %s is compiled without a stored program: %s", name, e)
        return None
    finally:
        metrics.record_phase("program_key", time.perf_counter() - start)


def _serve(pkey: ProgramKey, session: Session, gm, example_inputs, name_of, reason: str, replay: bool):
    """The Dynamo graph served from its stored program (no AOTAutograd), or None on a miss."""
    start, served = time.perf_counter(), None
    store = session.store
    try:
        program = store.load_program(pkey.key)
        if program is not None:
            served = serve(program, pkey.key, gm, example_inputs, session, name_of, reason, replay)  # may restart
        elif missed := store.why_missed("program", pkey.parts, pkey.detail, name_of("program")):
            emit(Event("program", program=pkey.key, missed=missed))
    except LoweringError as e:
        log.warning("hpu_backend: stored program for %s cannot be served (%s); quarantined, compiling instead",
                    name_of("program"), e.reason)
        store.discard(pkey.key)
    except DRIFT as e:  # torch's internals differ from those a program is served with: trace instead
        drifted(f"serving a stored program: {type(e).__name__}: {e}")
    except TensorifyScalarRestartAnalysis:
        served = True
        raise
    finally:
        metrics.record_phase("program_load", time.perf_counter() - start)
        metrics.record_program(hit=served is not None)
        if getattr(served, "floats", None):  # a restart served the program it names: two entries
            metrics.record_program(hit=True)
    return served


def _graph_name(graph_id: int, kind: str) -> str:
    return f"fx_graph_{graph_id:04d}" + (f"_{_SUFFIX[kind]}" if kind in _SUFFIX else "")


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *, kind: str, name: str, session: Session,
                   reason: str, recorder: Recorder | None, inner: list, labels: tuple[str, ...] = ()):
    start = time.perf_counter()
    ctx = LoweringContext(settings=session.settings, name=name, kind=kind, guards=_shape_guards(), gm=gm,
                          input_labels=labels)
    graph = session.graph_step(name, lambda: CompiledGraph.build(gm, ctx, session, reason), lambda: None)
    if recorder is not None:
        recorder.add(kind, graph)
    inner[0] += time.perf_counter() - start
    return graph if graph is not None else boxed(gm)


_MODULE_PART = re.compile(r"\._(modules|parameters|buffers)\['([^']+)'\]")
_LOCAL = re.compile(r"L\['([^']+)'\]")


def input_labels(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The user's names of the Dynamo graph's inputs, one per placeholder: the placeholder's own where Dynamo
    gives no source."""
    labels = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            name = getattr(source, "name", None)
            labels.append(readable_source(name) if isinstance(name, str) else node.name)
    return tuple(labels)


def readable_source(name: str) -> str:
    """``L['self']._modules['fc1']._parameters['weight']`` → ``fc1.weight`` (the module's attribute path, whatever
    the frame calls the module); ``L['x'].size()[0]`` → ``x.size(0)``."""
    if _MODULE_PART.search(name):
        name = _LOCAL.sub("", name, count=1)  # the module itself: its frame-local name says nothing
        name = _MODULE_PART.sub(r".\2", name).lstrip(".")
    name = _LOCAL.sub(r"\1", name)
    return re.sub(r"\.size\(\)\[(\d+)\]", r".size(\1)", name) or name


def _compile_reason(settings: Settings) -> str:
    """"guard failure" when Dynamo recompiles a frame whose earlier graphs' guards failed (explained in
    ``serve/recompiles.py``), else "new graph" (also for a second module through Dynamo's shared wrapper)."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    first_of_callable = recompiles.another_callable(compile_id)  # records the callable on every compile
    if compile_id is None or not compile_id.frame_compile_id or first_of_callable:
        return "new graph"
    recompiles.note(recompiles.explain(), settings.recompile_warn)
    return "guard failure"


def _shape_guards() -> tuple:
    """The ShapeEnv's guards so far (sympy booleans); a recipe records those over its symbols."""
    ctx = torch._guards.TracingContext.try_get()
    shape_env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
    if shape_env is None:
        return ()
    return tuple(g.expr for g in shape_env.guards)
