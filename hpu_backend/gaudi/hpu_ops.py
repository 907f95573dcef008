"""The ``torch.ops.hpu.*`` kernels Gaudi clients call directly, defined on request (``register()``).

DeepSpeed's ``FusedAdam`` on HPU steps through ``torch.ops.hpu.optimizer_adamw``; Optimum Habana's and
diffusers' rotary paths call ``torch.ops.hpu.rotary_pos_embedding`` and its backward; Optimum's MoE layers call
``torch.ops.hpu.mixture_of_experts`` (``moe.py``). Each is defined in the ``hpu`` operator namespace with a
CompositeImplicitAutograd kernel written with torch's ops: it runs on host and device tensors alike, and lazy
mode, autograd and torch.compile see the ops it is made of.

``optimizer_adamw(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps, weight_decay[,
has_weight_decay])`` is one Adam step per tensor, in place, as DeepSpeed's HPU builder feeds it: the learning
rate and both bias corrections are folded into ``neg_step`` (``-lr * sqrt(1 - beta2^t) / (1 - beta1^t)``),
``weight_decay`` is the decoupled factor ``1 - lr * wd`` that multiplies the parameter first (a float in lazy
mode; a tensor plus ``has_weight_decay`` in eager mode), and then::

    exp_avg    = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad²
    param      = param + neg_step * exp_avg / (sqrt(exp_avg_sq) + eps)
"""

from __future__ import annotations

import torch

from . import moe, rotary

_ADAMW = ("optimizer_adamw(Tensor[] gradient_vec, Tensor(a!)[] weights_vec, Tensor(b!)[] exp_avg_vec, "
          "Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, float epsilon, "
          "float modified_weight_decay) -> ()")
_ADAMW_TENSOR = ("optimizer_adamw.tensor_wd(Tensor[] gradient_vec, Tensor(a!)[] weights_vec, "
                 "Tensor(b!)[] exp_avg_vec, Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, "
                 "float epsilon, "
                 "Tensor modified_weight_decay, bool has_weight_decay=True) -> ()")
_ROPE = ("rotary_pos_embedding(Tensor input, Tensor sin, Tensor cos, Tensor? position_ids, int offset, "
         "int mode) -> Tensor")
_ROPE_BACKWARD = ("rotary_pos_embedding_backward(Tensor grad_in, Tensor sin, Tensor cos, Tensor? position_ids, "
                  "int offset, int mode) -> Tensor")
_KERNELS = "CompositeImplicitAutograd"


def registered() -> bool:
    return hasattr(torch.ops.hpu, "optimizer_adamw")


def register() -> None:
    """Define the ``hpu`` operators (once per process; torch keeps the definitions alive)."""
    if registered():
        return
    for schema in (_ADAMW, _ADAMW_TENSOR, _ROPE, _ROPE_BACKWARD, moe.SCHEMA, moe.FUSED_SCHEMA):
        name, _, rest = schema.partition("(")
        torch.library.define(f"hpu::{name}", f"({rest}")
    torch.library.impl("hpu::optimizer_adamw", _KERNELS)(_adamw_float)
    torch.library.impl("hpu::optimizer_adamw.tensor_wd", _KERNELS)(_adamw_tensor)
    torch.library.impl("hpu::rotary_pos_embedding", _KERNELS)(rotary.rotary_pos_embedding)
    torch.library.impl("hpu::rotary_pos_embedding_backward", _KERNELS)(rotary.rotary_pos_embedding_backward)
    torch.library.impl("hpu::mixture_of_experts", _KERNELS)(moe.mixture_of_experts)
    torch.library.impl("hpu::mixture_of_experts.fused_weights", _KERNELS)(moe.mixture_of_experts_fused)


def _adamw_float(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps, weight_decay) -> None:
    _adamw(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps,
           None if weight_decay == 1.0 else weight_decay)


def _adamw_tensor(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps, weight_decay,
                  has_weight_decay=True) -> None:
    _adamw(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps,
           weight_decay if has_weight_decay else None)


def _adamw(grads, params, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, eps, decay) -> None:
    """One step of every tensor (see the module docstring); ``decay`` None: no weight decay."""
    with torch.no_grad():
        for grad, param, exp_avg, exp_avg_sq in zip(grads, params, exp_avgs, exp_avg_sqs, strict=True):
            if decay is not None:
                param.mul_(decay)
            exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            param.add_(exp_avg / (exp_avg_sq.sqrt() + eps) * neg_step)
