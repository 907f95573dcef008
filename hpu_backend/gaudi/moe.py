"""Gaudi's dynamic MoE kernel, ``torch.ops.hpu.mixture_of_experts``: what Optimum Habana's Mixtral, Qwen2-MoE,
Qwen3-MoE and DeepSeek layers call in place of their per-expert loop.

``mixture_of_experts(hidden_states [tokens, hidden], expert_routing_table [tokens, k] (int), router_weights
[tokens, k], w1, w2, w3 (one weight per expert), permuted_weights, activation, experts_min, experts_max)``: each
token's output is the sum over its k routed experts ``e`` of ``router_weight * (act(x @ w1[e]) * (x @ w2[e])) @
w3[e]``, the gated MLP of LLaMA-style experts (``w1`` the gate projection, ``w2`` the up projection, ``w3`` the
down projection). The weight lists hold experts ``experts_min .. experts_max`` (an expert-parallel rank's share);
a token routed to an expert outside that range gets nothing from it. ``permuted_weights=True``: the weights are
as ``nn.Linear`` stores them ([out, in]); False: [in, out]. The ``fused_weights`` overload takes ``w12``, the gate
and up projections concatenated along the output dimension.

Computed here densely, as a static-shape kernel must be: every expert runs on every token and is weighted by that
token's routing weight for it (zero where the token is not routed there). The sums run over experts in order, as
the per-expert loop of the models' own code does, so the numbers are the loop's; the FLOPs are ``experts / k``
times the routed ones, which the estimate counts as the host runs them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}

SCHEMA = ("mixture_of_experts(Tensor hidden_states, Tensor expert_routing_table, Tensor router_weights, "
          "Tensor[] w1, Tensor[] w2, Tensor[] w3, bool permuted_weights=True, str activation=\"silu\", "
          "int experts_min=0, int experts_max=0) -> Tensor")
FUSED_SCHEMA = ("mixture_of_experts.fused_weights(Tensor hidden_states, Tensor expert_routing_table, "
                "Tensor router_weights, Tensor[] w12, Tensor[] w3, bool permuted_weights=True, "
                "str activation=\"silu\", int experts_min=0, int experts_max=0) -> Tensor")


def mixture_of_experts(hidden_states: torch.Tensor, expert_routing_table: torch.Tensor,
                       router_weights: torch.Tensor, w1: list[torch.Tensor], w2: list[torch.Tensor],
                       w3: list[torch.Tensor], permuted_weights: bool = True, activation: str = "silu",
                       experts_min: int = 0, experts_max: int = 0) -> torch.Tensor:
    act = _activation(activation)
    _check_experts(experts_min, experts_max, w1=w1, w2=w2, w3=w3)
    out = torch.zeros_like(hidden_states)
    for offset, (gate, up, down) in enumerate(zip(w1, w2, w3)):
        weight = _routed(expert_routing_table, router_weights, experts_min + offset)
        h = act(_linear(hidden_states, gate, permuted_weights)) * _linear(hidden_states, up, permuted_weights)
        out = out + _linear(h, down, permuted_weights) * weight
    return out


def mixture_of_experts_fused(hidden_states: torch.Tensor, expert_routing_table: torch.Tensor,
                             router_weights: torch.Tensor, w12: list[torch.Tensor], w3: list[torch.Tensor],
                             permuted_weights: bool = True, activation: str = "silu", experts_min: int = 0,
                             experts_max: int = 0) -> torch.Tensor:
    _check_experts(experts_min, experts_max, w12=w12, w3=w3)
    dim = 0 if permuted_weights else 1
    w1, w2 = zip(*(w.chunk(2, dim=dim) for w in w12)) if w12 else ((), ())
    return mixture_of_experts(hidden_states, expert_routing_table, router_weights, list(w1), list(w2), w3,
                              permuted_weights, activation, experts_min, experts_max)


def _routed(table: torch.Tensor, weights: torch.Tensor, expert: int) -> torch.Tensor:
    """Each token's routing weight for ``expert`` ([tokens, 1]; zero where it is not routed there)."""
    return (weights * (table == expert).to(weights.dtype)).sum(dim=-1, keepdim=True)


def _linear(x: torch.Tensor, w: torch.Tensor, permuted: bool) -> torch.Tensor:
    return F.linear(x, w) if permuted else x @ w


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"mixture_of_experts: activation={name!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _check_experts(experts_min: int, experts_max: int, **lists: list[torch.Tensor]) -> None:
    count = experts_max - experts_min + 1
    for name, weights in lists.items():
        if len(weights) != count:
            raise ValueError(f"mixture_of_experts: {name} holds {len(weights)} experts, but experts_min="
                             f"{experts_min} .. experts_max={experts_max} names {count}")
