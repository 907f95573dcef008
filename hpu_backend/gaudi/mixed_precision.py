"""Mixed precision with Gaudi's autocast op lists: ``with hpu_backend.gaudi.autocast(): ...``.

``torch.autocast(device_type="hpu", dtype=torch.bfloat16)`` is accepted by torch but casts nothing
on host tensors: torch's autocast acts per device, and the AutocastHPU kernels never run on the host
(and CPU autocast has its own fixed lists); on the hpu device (``hpu_backend.device``) it casts by
Gaudi's lists. ``autocast()`` applies
Gaudi's lists instead, as a ``TorchFunctionMode``: a call of an op on the lower-precision list gets
its floating-point tensor arguments cast to bf16, an op on the FP32 list to float32, above autograd
(so gradients flow back through the casts, as with torch's autocast). Dynamo traces the mode, so
under ``torch.compile`` the casts are ``_to_copy`` nodes of the graph and each recipe node records
the dtype it produces (``Node.out[i].dtype``). Ops on neither list follow torch's type promotion,
which is what Gaudi's "promote" registration does.

The lists, their defaults and the files that replace them: ``hpu_backend/device/autocast_lists.py``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch
from torch.overrides import TorchFunctionMode

from ..device.autocast_lists import (FP32_ENV, FP32_OPS, LOWER_ENV, LOWER_PRECISION_OPS,  # noqa: F401  (Gaudi's names)
                                     AutocastListError, callables_of, op_lists)

DTYPES = (torch.bfloat16, torch.float16)
_CASTABLE = (torch.float32, torch.bfloat16, torch.float16)


def _policy(lower: tuple[str, ...], fp32: tuple[str, ...], dtype: torch.dtype) -> dict[Callable, torch.dtype]:
    """Entry point → dtype its floating-point inputs are cast to; lower precision wins, as on Gaudi."""
    policy = {fn: torch.float32 for name in fp32 for fn in callables_of(name)}
    policy.update({fn: dtype for name in lower for fn in callables_of(name)})
    return policy


def _cast(value: Any, dtype: torch.dtype) -> Any:
    # As torch's autocast: float64 is left alone, integer and bool tensors too.
    if isinstance(value, torch.Tensor) and value.dtype in _CASTABLE and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


class autocast(TorchFunctionMode):
    """``with autocast(): ...`` runs listed ops in ``dtype`` (bf16) or float32, per Gaudi's op lists."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, enabled: bool = True,
                 env: Mapping[str, str] = os.environ):
        if dtype not in DTYPES:
            raise ValueError(f"autocast: dtype {dtype} is not one of {', '.join(map(str, DTYPES))}")
        super().__init__()
        self.dtype = dtype
        self.lower_ops, self.fp32_ops = op_lists(env) if enabled else ((), ())
        self._dtype_of = _policy(self.lower_ops, self.fp32_ops, dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = self._dtype_of.get(func)
        if dtype is not None:
            args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)
