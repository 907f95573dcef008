"""FLOPs and HBM bytes of one op at concrete shapes, for the roofline cost model (an estimate)."""

from __future__ import annotations

import math
from typing import Mapping

from ..formats.recipe import Node, ValueSpec
from ..formats import symexpr
from .buffers import SDPA_BACKWARD, SDPA_FORWARD
from .optable import packet_name

# TPC FLOPs per element by op kind (transcendentals and normalizations take several).
PER_ELEMENT = {"elementwise": 1, "foreach": 1, "reduction": 1, "softmax": 5, "norm": 8, "index": 1, "random": 4,
               "loss": 4, "factory": 0, "layout": 0, "sync": 0, "view": 0}
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv"}


def dims(spec: ValueSpec, env: Mapping[str, int]) -> list[int]:
    return [int(symexpr.evaluate(d, env)) for d in spec.shape]


# Backward attention FLOPs as a multiple of the forward's (QKᵀ and PV): four matmuls (dV, dP, dQ, dK)
# are 2×, plus what is recomputed. None: a plain sdpa op, flash-style, recomputes QKᵀ (+0.5×);
# FusedSDPA without recompute reads the saved probabilities (+0); with recompute it runs the forward again (+1×).
SDPA_BACKWARD_FACTOR = {None: 2.5, False: 2.0, True: 3.0}


def mme_flops(node: Node, ins: list[ValueSpec], env: Mapping[str, int], recompute: bool | None = None) -> float:
    """Matrix FLOPs (2 per multiply-add) of an MME op (``recompute``: FusedSDPA's choice, for attention)."""
    packet = packet_name(node.op)
    out = math.prod(dims(node.out[0], env)) if node.out and node.out[0].kind == "tensor" else 0
    if packet in MATMULS:
        a = ins[-2] if packet in ("addmm", "baddbmm", "addbmm", "addmv") else ins[0]
        return 2.0 * out * dims(a, env)[-1]
    if packet == "convolution":
        w = dims(ins[1], env)
        return 2.0 * out * math.prod(w[1:])
    if packet == "convolution_backward":
        w = dims(ins[2], env)
        return 4.0 * math.prod(dims(ins[0], env)) * math.prod(w[1:])
    if packet in SDPA_FORWARD | SDPA_BACKWARD:  # ``ins``: the query, key and value (``buffers.sdpa_operands``)
        q, k = dims(ins[0], env), dims(ins[1], env)
        fw = 4.0 * math.prod(q) * k[-2]  # QKᵀ and PV
        return fw * (SDPA_BACKWARD_FACTOR[recompute] if packet in SDPA_BACKWARD else 1.0)
    return 2.0 * out


def tpc_flops(kind: str, ins: list[ValueSpec], node: Node, env: Mapping[str, int]) -> float:
    if kind == "foreach":  # one kernel over every tensor of its lists
        lists = (ins, node.out)
        return float(max(sum(math.prod(dims(s, env)) for s in specs if s.kind == "tensor") for specs in lists))
    sizes = [math.prod(dims(s, env)) for s in [*ins[:1], *node.out] if s.kind == "tensor"]
    return float(PER_ELEMENT.get(kind, 1) * max(sizes, default=0))
