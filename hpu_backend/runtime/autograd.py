"""AOTAutograd's runtime contract, rebuilt from a program's plain data: what runs a program's graphs.

AOTAutograd wraps its compiled graphs in runtime wrappers (grad mode, autocast, an
``autograd.Function`` that saves tensors for the backward, marks outputs non-differentiable, lays
out incoming gradients). A program stores those decisions as indices (``program.Contract``) for
the cases it supports: no output aliases an input or an intermediate, no input is mutated outside
the graph, no tensor subclass, no RNG or effect tokens. Here they become two small callables,
so that a program from the cache runs without AOTAutograd being traced or even imported.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.autograd.function import once_differentiable

from ..formats.program import Contract

Graph = Callable[[list], list]

# The private torch APIs this contract runs on (those AOTAutograd's own runtime wrappers use). A torch
# version without one of them serves no stored program (serve/programs.py checks): it traces instead.
INTERNALS = (("torch._C", "_set_grad_enabled"), ("torch._C", "_DisableAutocast"),
             ("torch.autograd.graph", "increment_version"), ("torch.Tensor", "_is_view"))


def missing_internals() -> list[str]:
    """The names of INTERNALS this torch lacks (empty: programs can be served)."""
    roots = {"torch._C": torch._C, "torch.autograd.graph": torch.autograd.graph, "torch.Tensor": torch.Tensor}
    return [f"{owner}.{name}" for owner, name in INTERNALS if not hasattr(roots[owner], name)]


MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                  "channels_last_3d": torch.channels_last_3d}


def inference_call(graph: Graph, c: Contract) -> Callable[..., list]:
    """``call(*args)``: the graph with grad mode off, as AOTAutograd runs an inference graph."""
    mutated, disable_amp = c.mutated_inputs, c.disable_amp

    def call(*args: Any) -> list:
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            if disable_amp:
                with torch._C._DisableAutocast():
                    outs = graph(list(args))
            else:
                outs = graph(list(args))
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        if mutated:
            torch.autograd.graph.increment_version(tuple(args[i] for i in mutated))
        return outs

    return call


def training_call(forward: Graph, backward: Graph, c: Contract) -> Callable[..., list]:
    """``call(*args)``: forward and backward graphs behind one autograd.Function."""
    function = _function(forward, backward, c)
    mutated = c.mutated_inputs

    def call(*args: Any) -> list:
        with torch.enable_grad():
            outs = function.apply(*args)
        if mutated:
            torch.autograd.graph.increment_version(tuple(args[i] for i in mutated))
        return list(outs)

    return call


def _function(forward: Graph, backward: Graph, c: Contract) -> type:
    saved, unchecked, symints = slice(*c.saved), slice(*c.saved_unchecked), slice(*c.saved_symints)
    n, non_diff, unsafe_view = c.num_outputs, c.non_differentiable, c.unsafe_view
    tangents = list(zip(c.tangents, c.tangent_layouts))
    amp = torch._C._DisableAutocast if c.disable_amp else contextlib.nullcontext

    class CompiledProgram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with amp():
                outs = forward(list(args))
            ctx.save_for_backward(*(_plain(t) for t in outs[saved]))
            ctx.unchecked = [_plain(t) for t in outs[unchecked]]
            ctx.symints = outs[symints]
            raw = outs[:n]
            for i in unsafe_view:
                raw[i] = torch.ops.aten._unsafe_view(raw[i], raw[i].shape)
            ctx.mark_non_differentiable(*(raw[i] for i in non_diff if isinstance(raw[i], torch.Tensor)))
            ctx._materialize_non_diff_grads = False
            return tuple(raw)

        @staticmethod
        @once_differentiable
        def backward(ctx, *grads):
            args = [*ctx.symints, *ctx.saved_tensors, *ctx.unchecked,
                    *(_layout(grads[i], layout) for i, layout in tangents)]
            with amp():
                return tuple(backward(args))

    return CompiledProgram


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A saved view is saved detached, as AOTAutograd does (its base may be mutated later)."""
    return t.detach() if t._is_view() else t


def _layout(grad: torch.Tensor | None, layout: Any) -> torch.Tensor | None:
    """An incoming gradient in the memory layout the backward graph was traced with."""
    if grad is None:
        return None
    if isinstance(layout, str):
        fmt = MEMORY_FORMATS[layout]
        return grad if grad.is_contiguous(memory_format=fmt) else grad.contiguous(memory_format=fmt)
    size, stride = layout
    if list(grad.shape) == size and list(grad.stride()) == stride:
        return grad
    out = torch.empty_strided(size, stride, dtype=grad.dtype, device=grad.device)
    return out.copy_(grad)

