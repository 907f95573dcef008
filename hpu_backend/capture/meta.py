"""A model built on the meta device, traced on fake inputs with chosen dimensions symbolic (no weights).

What capacity planning lowers: the graph of ``model(*inputs)`` in the HPU op set, with parameters and
buffers as leading inputs, the dimensions in ``dynamic`` symbolic and every other one static. The meta
weights become fake tensors on the inputs' device (nothing is allocated), so that ops decompose as they
would for it (sdpa keeps its fused op).
"""

from __future__ import annotations

from typing import Collection

import torch

from .decompositions import hpu_decompositions


def trace_symbolic(model: torch.nn.Module, inputs: list, dynamic: Collection[tuple[int, int]]
                   ) -> torch.fx.GraphModule:
    """The aten graph of ``model(*inputs)``; ``dynamic`` holds the (input, dim) pairs left symbolic."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    convert = mode.fake_tensor_converter
    fake_state = {k: convert.from_meta_and_device(mode, v, device) for k, v in state.items()}

    def fake(i: int, t: torch.Tensor):
        sizes = [DimDynamic.DYNAMIC if (i, d) in dynamic else DimDynamic.STATIC for d in range(t.dim())]
        return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))

    fake_inputs = [fake(i, t) for i, t in enumerate(inputs)]
    names = list(fake_state)

    def step(*args):
        params = dict(zip(names, args[:len(names)]))
        out = torch.func.functional_call(model, params, tuple(args[len(names):]))
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    trace = make_fx(step, decomposition_table=hpu_decompositions(), tracing_mode="symbolic")
    with torch.no_grad():
        return trace(*fake_state.values(), *fake_inputs)
