"""The torch.compile entry point: Dynamo graph → AOTAutograd → lowering → recipe → executor.

``hpu_backend`` is registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="hpu_backend")`` needs no import of ours. A graph that cannot be
lowered runs eagerly after one warning, unless strict mode asks for the error instead.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from .compiled import CompiledGraph
from .decompositions import hpu_decompositions
from .lowering import LoweringContext, LoweringError
from .settings import Settings

log = logging.getLogger(__name__)

_graph_ids = itertools.count()
_SUFFIX = {"forward": "fw", "backward": "bw", "inference": "inf"}


def hpu_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, **kwargs: Any):
    """Dynamo backend: lower each AOTAutograd graph of ``gm`` to recipes for the simulated HPU."""
    if kwargs.get("mode") not in (None, "default"):
        log.debug("hpu_backend ignores mode=%r", kwargs["mode"])
    settings = Settings.from_options(options)
    graph_id = next(_graph_ids)
    reason = _compile_reason()

    def compiler(kind: str):
        return functools.partial(_compile_graph, kind=kind, graph_id=graph_id, settings=settings, reason=reason)

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=hpu_decompositions(),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *, kind: str, graph_id: int,
                   settings: Settings, reason: str):
    name = f"fx_graph_{graph_id:04d}_{_SUFFIX[kind]}"
    ctx = LoweringContext(settings=settings, name=name, kind=kind, guards=_shape_guards())
    try:
        return CompiledGraph.build(gm, ctx, reason)
    except LoweringError as e:
        if settings.strict:
            raise
        log.warning("hpu_backend: could not lower %s, running it eagerly: %s", name, e.reason)
        log.debug("lowering failure of %s in full:\n%s", name, e)
        return make_boxed_func(gm)


def _compile_reason() -> str:
    """"guard failure" when Dynamo recompiles a frame whose earlier graphs' guards failed."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    return "guard failure" if compile_id is not None and compile_id.frame_compile_id else "new graph"


def _shape_guards() -> list:
    """The ShapeEnv's guards so far (sympy booleans); a recipe records those over its symbols."""
    ctx = torch._guards.TracingContext.try_get()
    shape_env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
    if shape_env is None:
        return []
    return [g.expr for g in shape_env.guards]
