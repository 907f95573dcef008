"""Moving a tensor object onto the device or off it: ``module.to("hpu")`` of a parameter that something holds a
weak reference to, and ``t.data = d`` where one of them is a device tensor.

A device tensor is a wrapper subclass (``tensor.py``), so torch's ``Module._apply`` moves each parameter with
``torch.utils.swap_tensors`` (the new tensor's contents into the old Python object), where a backend with
storage of its own would assign ``param.data``. torch's swap refuses a tensor that has a weak reference
(DeepSpeed, ``weakref.finalize``, caches keyed weakly by parameter), which a ``.data`` assignment never does.
The swap here does what torch's does and keeps the weak references: they refer to the object, and the object
(the parameter the model holds) is the one that stays, now on the device. Nor does it refuse a tensor an autograd
graph holds (a forward on the CPU before the move): the graph keeps the host tensor it saved. Tensors that are
not device tensors go to torch's own swap, unchanged.

``t.data = d`` (``set_data``, installed as ``torch.Tensor.data``'s setter): between two device tensors torch gives
``t`` the metadata of ``d`` and ``t`` takes ``d``'s host tensor too, so that it reads and writes the very memory
``d`` does (a parameter made a view of a flat buffer stays one, as DeepSpeed's ZeRO makes them). Between a host
tensor and a device tensor torch refuses (a wrapper's type is not a dense backend's), where a backend with
storage of its own moves ``t`` to ``d``'s device: DeepSpeed's AutoTP shards a CPU model's weights onto the card
this way, and older scripts write ``p.data = p.data.to(device)``. The same object then becomes a tensor on
``d``'s device sharing ``d``'s memory, by the swap above, keeping its attributes, its ``requires_grad`` and
whether it is a parameter; a gradient on the old device is dropped (torch could not accumulate into it).
"""

from __future__ import annotations

import copyreg

import torch

from .tensor import HpuTensor

_TORCH_SWAP = torch.utils.swap_tensors
_TENSOR_DATA = torch._C.TensorBase.data  # torch's own descriptor, which ``data`` below extends


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


def set_data(t: torch.Tensor, new: torch.Tensor) -> None:
    """``t.data = new`` (see the module docstring)."""
    on_device = isinstance(t, HpuTensor)
    if not isinstance(new, torch.Tensor) or isinstance(new, HpuTensor) == on_device:
        _TENSOR_DATA.__set__(t, new)
        if on_device:
            t.host = new.host
        return
    moved = new.detach()
    if isinstance(t, torch.nn.Parameter):
        moved = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
    else:
        moved.requires_grad_(t.requires_grad)
    for name, value in vars(t).items():
        if name not in _DEVICE_ATTRIBUTES:
            setattr(moved, name, value)
    swap_tensors(t, moved)


data = property(_TENSOR_DATA.__get__, set_data, doc=_TENSOR_DATA.__doc__)  # a read is torch's own, no frame of ours
_DEVICE_ATTRIBUTES = ("host", "_is_param")  # what a device tensor holds of its own
