"""Moving a parameter that something holds a weak reference to onto the device (``module.to("hpu")``).

A device tensor is a wrapper subclass (``tensor.py``), so torch's ``Module._apply`` moves each parameter with
``torch.utils.swap_tensors`` (the new tensor's contents into the old Python object), where a backend with
storage of its own would assign ``param.data``. torch's swap refuses a tensor that has a weak reference
(DeepSpeed, ``weakref.finalize``, caches keyed weakly by parameter), which a ``.data`` assignment never does.
The swap here does what torch's does and keeps the weak references: they refer to the object, and the object
(the parameter the model holds) is the one that stays, now on the device. Nor does it refuse a tensor an autograd
graph holds (a forward on the CPU before the move): the graph keeps the host tensor it saved. Tensors that are
not device tensors go to torch's own swap, unchanged.
"""

from __future__ import annotations

import copyreg

import torch

from .tensor import HpuTensor

_TORCH_SWAP = torch.utils.swap_tensors


def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``torch.utils.swap_tensors``, also for a device tensor and a tensor with weak references, or one that an
    autograd graph still holds (a forward on the CPU before ``module.to("hpu")``: the graph keeps the host values it
    saved, as a ``.data`` assignment on another device leaves them; torch's swap refuses such a tensor)."""
    if not (isinstance(t1, HpuTensor) or isinstance(t2, HpuTensor)):
        return _TORCH_SWAP(t1, t2)
    slots = set(copyreg._slotnames(t1.__class__))
    if slots != set(copyreg._slotnames(t2.__class__)):
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    for name in ("__class__", "__dict__", *sorted(slots)):
        _swap_attribute(t1, t2, name)
    torch._C._swap_tensor_impl(t1, t2)


def _swap_attribute(t1, t2, name: str) -> None:
    first, second = getattr(t1, name, _MISSING), getattr(t2, name, _MISSING)
    for t, value in ((t1, second), (t2, first)):
        if value is _MISSING:
            delattr(t, name)
        else:
            setattr(t, name, value)


_MISSING = object()
