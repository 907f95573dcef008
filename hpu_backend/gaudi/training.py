"""Gaudi's training APIs: fused optimizers, fused gradient clipping and mark_step.

===========================================================  ==========================================
Gaudi (``habana_frameworks.torch``)                          here
===========================================================  ==========================================
``hpex.optimizers.FusedAdamW(params, lr, betas, eps=1e-6,    ``hpu_backend.gaudi.FusedAdamW``: torch's
weight_decay)``                                              foreach AdamW kernels, Gaudi's default eps
``hpex.optimizers.FusedSGD(params, lr, momentum, ...)``      ``FusedSGD``: torch's foreach SGD kernels
``hpex.normalization.FusedClipNorm(params, max_norm)`` and   ``FusedClipNorm``: ``clip_grad_norm_`` with
``.clip_norm(params)``                                       torch's foreach kernels
``core.mark_step()``                                         ``mark_step()``: see below
===========================================================  ==========================================

``mark_step()`` ends a lazy-mode graph, as on Gaudi: in lazy mode (``device/lazy.py``) it runs the pending graph
and starts the next step of the report. Under ``torch.compile`` it is a graph boundary (Dynamo does not
trace into it, so a compiled region ends there). It counts in ``metric_global("mark_step")`` always.

The optimizers step with torch's multi-tensor (foreach) kernels rather than its fused CPU kernel:
Dynamo traces the former into a recipe and skips the latter, so a compiled step would run eagerly.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .. import metrics
from ..device import context


class FusedAdamW(torch.optim.AdamW):
    """AdamW with Gaudi's defaults (``eps=1e-6``), stepping with torch's foreach kernels. On the hpu device its
    step counts, step sizes and bias corrections are device tensors, as Gaudi's FusedAdamW takes them: a lazy
    graph of the step is the same graph every step (with Python floats it would hold new constants each step,
    and compile again)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=True)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["capturable"] = _on_device(group["params"])
        return super().step(closure)


def _on_device(params: list[torch.Tensor]) -> bool:
    """Whether a parameter group lives on the hpu device (torch's capturable step: its values as device tensors)."""
    return bool(params) and all(p.device.type == "hpu" for p in params)


class FusedSGD(torch.optim.SGD):
    """SGD (momentum, dampening, Nesterov, weight decay as torch's), stepping with torch's foreach kernels."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, foreach=True)


class FusedClipNorm:
    """Gradient-norm clipping as Gaudi spells it: ``FusedClipNorm(params, max_norm).clip_norm(params)``."""

    def __init__(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0):
        self.max_norm = float(max_norm)
        self.norm_type = float(norm_type)

    def clip_norm(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """Scale the gradients in place so that their total norm is at most ``max_norm``; returns that norm."""
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, self.norm_type, foreach=True)


def mark_step() -> None:
    """Run the pending lazy graph in lazy mode; a graph boundary under torch.compile; counted in
    ``metric_global("mark_step")``."""
    if torch.compiler.is_compiling():  # Dynamo is tracing this call: break the graph here, run it eagerly
        _boundary()
    else:
        _mark_step()


def _mark_step() -> None:
    metrics.record_mark_step()
    context.mark_step()


# torch.compiler.disable(_mark_step), with Dynamo imported at its first call rather than here: only a trace
# calls it, and importing Dynamo (≈1 s) when the device starts would double the launcher's start-up.
_boundary = torch._disable_dynamo(_mark_step)
