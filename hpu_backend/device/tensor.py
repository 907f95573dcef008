"""The hpu device's tensor: a wrapper tensor on ``torch.device("hpu")`` holding its data in a host tensor.

``HpuTensor`` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``): torch sees a tensor on the
``hpu`` device (PrivateUse1, renamed) with its own shape, strides and dtype, and autograd works on it as on
any device tensor; its values live in ``host``, a plain CPU tensor (views share their base's host storage).
Every aten op on it comes to ``__torch_dispatch__``, which hands it to the device (``dispatch.py``): eager or
lazy execution, placement, allocation, host reads. Under tracing (Dynamo's fake tensors, AOTAutograd's
functional tensors) the host is not a real tensor and ops simply run on it, so a compiled graph sees the
host tensors (``__tensor_flatten__``) and runs them through the backend like any other graph.
"""

from __future__ import annotations

import copy
import functools
import sys

import torch
from torch._C._dynamo.eval_frame import set_eval_frame

from . import context
from .cards import HPU


class HpuTensor(torch.Tensor):
    """A tensor on the hpu device; ``host`` holds its values."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor, device: torch.device | None = None, requires_grad: bool = False):
        prior = set_eval_frame(None)  # see untraced()
        try:
            if torch.is_inference_mode_enabled() and not host.is_inference():
                # a view of a normal tensor made in inference mode is a normal tensor (torch shares its version
                # counter with its base, which an inference tensor has none of): so is its device tensor
                with torch.inference_mode(False):
                    return HpuTensor(host, device, requires_grad)
            r = torch.Tensor._make_wrapper_subclass(
                cls, host.shape, strides=host.stride(), storage_offset=host.storage_offset(), dtype=host.dtype,
                device=device or CARD, requires_grad=requires_grad)
            r.host = host
            if type(host) is torch.Tensor:  # a real allocation (not a traced one): counted against the HBM
                context.current_context().memory.allocate(host)
            return r
        finally:
            set_eval_frame(prior)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        prior = set_eval_frame(None)  # see untraced()
        try:
            return context.current_device()(func, args, kwargs or {})
        finally:
            set_eval_frame(prior)

    # -- tracing: the host tensor is the subclass's one inner tensor --------------------------------------------

    def __tensor_flatten__(self):
        return ["_traced_host"], self.device

    @property
    def _traced_host(self) -> torch.Tensor:
        """The host tensor as a compiled graph reads it: pending lazy work on the device is done first."""
        context.before_compiled()
        return self.host

    @_traced_host.setter
    def _traced_host(self, host: torch.Tensor) -> None:
        """AOTAutograd gives a gradient the layout its backward was traced with (the stride of a size-1 dim, a
        memory format) by putting a restrided inner tensor in its place: the same values."""
        self.host = host

    @staticmethod
    def __tensor_unflatten__(inner: dict, device, outer_size, outer_stride):
        return HpuTensor(inner["_traced_host"], device)

    # -- host reads and serialization ---------------------------------------------------------------------------

    def __repr__(self, *, tensor_contents=None) -> str:
        if not is_plain(getattr(self, "host", None)):  # traced (a log line of Dynamo's): no values to read
            return f"HpuTensor(size={tuple(self.shape)}, dtype={self.dtype}, device='{self.device}')"
        text = repr(self.cpu())
        suffix = f", device='{self.device}'"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def untyped_storage(self) -> torch.UntypedStorage:
        """For torch.distributed (FSDP frees and restores each unsharded flat parameter by resizing its storage,
        which torch cannot do to a wrapper tensor's own), the host tensor's storage, pending work done first: the
        device's memory is the host's. For every other caller, Dynamo's fake tensors among them, the wrapper's
        own, as before."""
        if not is_plain(getattr(self, "host", None)) or not _from_distributed(sys._getframe(1)):
            return super().untyped_storage()
        device = context.enabled_device()
        storage = device.storage(self) if device is not None else self.host.untyped_storage()
        context.current_context().memory.watch_resizes(storage)  # counted at the size it is given
        return storage

    def tolist(self):
        """A host read of every value (torch's own ``tolist`` reads a tensor's memory, which is the host's)."""
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False):
        if force:  # torch documents force=True as a copy to host memory first
            return self.detach().cpu().resolve_conj().resolve_neg().numpy()
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")

    def __dlpack__(self, *args, **kwargs):
        """DLPack export: the device's memory is host memory, so the capsule shares the host tensor (a host read:
        pending work on it runs first) and names the CPU, the one device DLPack can name for it. A consumer that
        writes through it writes the device tensor, as DLPack's sharing means."""
        return self._dlpack_host().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._dlpack_host().__dlpack_device__()

    def _dlpack_host(self) -> torch.Tensor:
        if not is_plain(self.host):
            raise BufferError("a traced hpu tensor has no memory to share through DLPack")
        context.current_device().sync("DLPack export", [self.host])
        return self.host.detach()

    def __deepcopy__(self, memo):
        """A copy made by the device (a pending op in lazy mode, filled when its graph runs), never a copy of
        ``host``'s bytes, which torch's own deepcopy would take from the instance dict before they are filled."""
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "host"})
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):
        """Saved as its host values and device, rebuilt by torch's own loader (which ``weights_only`` allows)."""
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))


CARD = torch.device(HPU, 0)  # the process's one card (module.py says why)


def untraced(fn):
    """``fn`` with Dynamo's frame evaluation off while it runs. The device's code is the simulator, called from
    the dispatcher; when the caller runs under torch.compile between graphs (DDP's hooks, a graph break), Dynamo
    would otherwise compile the simulator's own frames (its clocks, its ``no_dispatch()`` blocks) as user code.
    (What ``torch._dynamo.disable`` does, without importing Dynamo or its wrapper's cost on every op.)"""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        prior = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)
    return run


def _from_distributed(frame) -> bool:
    """Whether the code asking (past torch's own ``Tensor._typed_storage``) is torch.distributed's."""
    while frame is not None and frame.f_globals.get("__name__") == "torch._tensor":
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("torch.distributed.")


def is_plain(t: torch.Tensor) -> bool:
    """A real host tensor (not a fake, functional or other traced one)."""
    return type(t) is torch.Tensor
