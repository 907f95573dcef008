"""The device's kernels at torch's dispatcher: factories that name the hpu device, and autocast on it.

An op whose tensor arguments include a device tensor reaches ``HpuTensor.__torch_dispatch__``; an op with no
device tensor among its arguments but ``device="hpu"`` (``torch.empty``/``randn``/``zeros(..., device="hpu")``,
and ``tensor.to("hpu")``, which allocates its result with ``empty_strided``) reaches the PrivateUse1 kernels
registered here. Every factory is built from these two allocations: the rest of it (``normal_``, ``zero_``,
``copy_``) is an op on the new device tensor.

``torch.autocast("hpu", dtype=torch.bfloat16)`` enables torch's AutocastPrivateUse1 key, which has no kernels
of torch's own: the ones registered here cast the floating-point arguments of the ops on Gaudi's lists
(``autocast_lists.py``) to the autocast dtype (lower-precision list) or float32 (FP32 list), then run the
op below autocast. An op on neither list runs as it comes, by torch's type promotion, as Gaudi does.
"""

from __future__ import annotations

import torch

from . import attention, context
from .autocast_lists import op_lists
from .cards import resolve
from .dispatch import is_pinned, pinned
from .tensor import HPU, HpuTensor, untraced

aten = torch.ops.aten
_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_CASTABLE = (torch.float32, torch.bfloat16, torch.float16)


def _device(device) -> torch.device | None:
    """The card a request names: this process's card, ``hpu:0`` (``torch.hpu.resolve``); a card past
    ``device_count()`` is refused, as a real device refuses a nonexistent ordinal."""
    if device is None:
        return None
    return resolve(torch.device(device))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    device = _device(device)
    context.current_context().memory.check_request(_nbytes(size, dtype))
    host = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return HpuTensor(host, device)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    device = _device(device)
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    context.current_context().memory.check_request(_nbytes([span], dtype))
    return HpuTensor(torch.empty_strided(size, stride, dtype=dtype), device)


def _nbytes(size, dtype) -> int:
    count = 1
    for n in size:
        count *= int(n)
    return count * (dtype or torch.get_default_dtype()).itemsize


def _copy_from(src, dst, non_blocking=False):
    """A copy torch makes below Python dispatch (``torch.tensor(data, device="hpu")``): done on the host tensors,
    after the device has run any pending work on the destination."""
    source = src.host if isinstance(src, HpuTensor) else src
    target = dst.host if isinstance(dst, HpuTensor) else dst
    device = context.enabled_device()
    if device is not None:
        device.sync_write(target)
        if isinstance(src, HpuTensor):
            device.sync_write(source)
    target.copy_(source)
    return dst


# Factories whose CPU kernel fills an ``out=`` tensor it resizes: a device tensor's shape is fixed when it is made,
# so these are made on the host, whole, and wrapped.
HOST_FACTORIES = ("arange", "linspace", "logspace", "eye", "randperm", "range", "tril_indices", "triu_indices")


def _host_factory(op):
    def kernel(*args, **kwargs):
        device = _device(kwargs.get("device"))
        kwargs["device"] = torch.device("cpu")
        return HpuTensor(op(*args, **kwargs), device)
    return kernel


def _pin_memory(self, device=None):
    """Page-locked host memory for copies to the device: host memory is all the simulated device reads, so a
    pinned tensor is a plain copy (what a pinned tensor is: a copy in other host memory), remembered as pinned so
    that its copies to the device are costed as DMA from pinned memory."""
    return pinned(self.clone())


def _is_pinned(self, device=None) -> bool:
    return is_pinned(self)


def _record_stream(self, stream) -> None:
    """Streams are host-synchronous here (work runs as it is issued): nothing to record. Reached below Python
    dispatch, e.g. FSDP's ``no_dispatch()`` record of a stream on a parameter it frees."""


def register(lib: torch.library.Library, every_op: torch.library.Library) -> None:
    """The factory and autocast kernels, into ``lib`` (an ``aten`` IMPL library) and ``every_op`` (a ``_`` IMPL
    library, for the autocast key's fallthrough); the caller keeps both alive."""
    every_op.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")  # ops on no list: as they come
    attention.register(lib)  # F.scaled_dot_product_attention as one fused op (attention.py)
    lib.impl("empty.memory_format", untraced(_empty), "PrivateUse1")
    lib.impl("empty_strided", untraced(_empty_strided), "PrivateUse1")
    lib.impl("_copy_from", untraced(_copy_from), "PrivateUse1")
    lib.impl("record_stream", _record_stream, "PrivateUse1")
    for name in HOST_FACTORIES:
        packet = getattr(aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not op._schema.is_mutable and any(a.name == "device" for a in op._schema.arguments):
                lib.impl(f"{name}.{overload}" if overload != "default" else name, untraced(_host_factory(op)),
                         "PrivateUse1")
    # DataLoader(pin_memory=True) pins for the current accelerator, now the hpu device: torch asks a C++
    # backend for a pinned-memory allocator, which a Python backend cannot give, so pinning is a host copy.
    lib.impl("_pin_memory", untraced(_pin_memory), "CPU")
    lib.impl("is_pinned", _is_pinned, "CPU")
    lower, fp32 = op_lists()
    casts = {name: torch.float32 for name in fp32}
    casts.update({name: None for name in lower})  # None: the autocast dtype; lower precision wins, as on Gaudi
    for name, dtype in casts.items():
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            lib.impl(f"{name}.{overload}" if overload != "default" else name,
                     untraced(_autocast_kernel(getattr(packet, overload), dtype)),
                     "AutocastPrivateUse1")


def _autocast_kernel(op, dtype: torch.dtype | None):
    def kernel(*args, **kwargs):
        to = dtype or torch.get_autocast_dtype(HPU)
        args, kwargs = _cast(args, to), {k: _cast(v, to) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
            return op(*args, **kwargs)
    return kernel


def _cast(value, dtype: torch.dtype):
    # As torch's autocast: only floating-point device tensors; float64, integers and bools are left alone.
    if isinstance(value, torch.Tensor) and value.dtype in _CASTABLE and value.dtype != dtype \
            and value.device.type == HPU:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value
