"""Gaudi's autocast op lists: the ops run in lower precision and the ops run in float32 under autocast.

Default lists: Intel Gaudi documentation, "Mixed Precision Training with PyTorch Autocast", Registered Operators
(https://docs.habana.ai/en/latest/PyTorch/PyTorch_Mixed_Precision/index.html). As there, an op on both lists runs
in lower precision; and the files named by ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` /
``PT_HPU_AUTOCAST_FP32_OPS_LIST`` (one op name per line; Optimum Habana's ``LOWER_LIST`` / ``FP32_LIST`` name the
same files) replace the defaults: when either is set, a list without a file is empty. The device's autocast
kernels (``kernels.py``) and ``hpu_backend.gaudi.autocast`` both cast by them.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from ..errors import HpuBackendError

LOWER_PRECISION_OPS = (
    "addmm", "addbmm", "batch_norm", "baddbmm", "bmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "dot", "dropout", "feature_dropout", "group_norm", "instance_norm",
    "layer_norm", "leaky_relu", "linear", "matmul", "mean", "mm", "mul", "mv", "softmax", "log_softmax",
    "scaled_dot_product_attention",
)
FP32_OPS = (
    "acos", "addcdiv", "asin", "atan2", "bilinear", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "cdist", "cosh", "cosine_embedding_loss", "cosine_similarity", "cross_entropy_loss", "dist", "div", "divide",
    "embedding", "embedding_bag", "erfinv", "exp", "expm1", "hinge_embedding_loss", "huber_loss", "kl_div",
    "l1_loss", "log", "log10", "log1p", "log2", "logsumexp", "margin_ranking_loss", "mse_loss", "multi_margin_loss",
    "multilabel_margin_loss", "nll_loss", "pdist", "poisson_nll_loss", "pow", "reciprocal", "renorm", "rsqrt",
    "sinh", "smooth_l1_loss", "soft_margin_loss", "softplus", "tan", "topk", "triplet_margin_loss", "truediv",
    "true_divide",
)
LOWER_ENV = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "LOWER_LIST")
FP32_ENV = ("PT_HPU_AUTOCAST_FP32_OPS_LIST", "FP32_LIST")

# ATen names whose Python entry point is spelled otherwise (F.cross_entropy calls aten::cross_entropy_loss).
_PYTHON_NAMES = {"cross_entropy_loss": ("cross_entropy",)}
_NAMESPACES = (torch, F, torch._C._nn, torch.Tensor)
_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class AutocastListError(HpuBackendError, ValueError):
    """An op-list file that is missing, unreadable or malformed, or that names no torch op (one line)."""


def op_lists(env: Mapping[str, str] = os.environ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(lower-precision ops, FP32 ops): Gaudi's defaults, or the files the environment names."""
    lower, fp32 = _env_file(env, LOWER_ENV), _env_file(env, FP32_ENV)
    if lower is None and fp32 is None:
        return LOWER_PRECISION_OPS, FP32_OPS
    return (_read_list(*lower) if lower else ()), (_read_list(*fp32) if fp32 else ())


def _env_file(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(variable, path) of the first of ``names`` set, Gaudi's own name first."""
    for name in names:
        if env.get(name):
            return name, env[name]
    return None


def _read_list(variable: str, path: str) -> tuple[str, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AutocastListError(f"{variable}={path}: cannot read the op list ({e.strerror or e}); "
                                f"point it at a text file with one op name per line") from None
    ops = []
    for number, line in enumerate(lines, 1):
        name = line.strip()
        if name and not _OP_NAME.fullmatch(name):
            raise AutocastListError(f"{variable}={path}: line {number} {name!r:.40} is not an op name; "
                                    f"write one op name per line (e.g. mm)")
        if name and not callables_of(name):
            raise AutocastListError(f"{variable}={path}: line {number}: {name!r} names no torch op")
        if name:
            ops.append(name)
    return tuple(ops)


def callables_of(name: str) -> list[Callable]:
    """The Python entry points of an ATen op name: torch.X, F.X, torch._C._nn.X, Tensor.X and its operators."""
    found = []
    for spelled in _PYTHON_NAMES.get(name, (name,)):
        for namespace in _NAMESPACES:
            for attr in (spelled, f"__{spelled}__", f"__r{spelled}__"):
                fn = getattr(namespace, attr, None)
                if callable(fn) and fn not in found:
                    found.append(fn)
    return found
