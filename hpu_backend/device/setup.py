"""``enable()``: turn the simulated hpu device on in this process (nothing happens at import time).

Enabling renames torch's PrivateUse1 backend to ``hpu``, registers ``module.py`` as ``torch.hpu``, generates
the ``Tensor.hpu()``/``Module.hpu()`` methods and installs the factory and autocast kernels (``kernels.py``),
once per process; then it starts the device (``dispatch.py``) in lazy or eager mode in the device context in use
(``context.py``), which owns its state. It is never done on import, so that on a Gaudi host Intel's own stack is
never shadowed; it refuses when PrivateUse1 already belongs to another backend. The mode is read here, once:
``PT_HPU_LAZY_MODE`` and the simulated release's default (``release.py``).
"""

from __future__ import annotations

import ctypes
import os
import types

import torch

from ..serve.session import session_for
from ..settings import Settings
from ..timeline import trace, whatif
from . import context, kernels, module, release, report as reporting, swap, tensor
from .context import DeviceSetupError
from .dispatch import Device

MODES = ("lazy", "eager")


def enable(mode: str | None = None, options: dict | None = None) -> types.ModuleType:
    """Enable the hpu device in ``mode`` ("lazy" | "eager"; None: ``PT_HPU_LAZY_MODE``, 1 → lazy, 0 → eager, unset
    → the simulated release's default, eager from Gaudi software 1.21 on: ``release.py``) with backend ``options``
    (target, cache, strict, ...); returns the ``torch.hpu`` module.
    Idempotent; a later call with another mode or options switches the device after running pending work.

    The thread that enables the device runs the device's backward itself (torch's autograd multithreading off
    for that thread), as it runs the CPU's: no hand-off to a device thread on every backward, and a device
    enabled after the process's first backward still runs one (torch sizes its device threads' queues at the
    first backward). Another thread's backward of device tensors needs the device enabled before the
    process's first backward."""
    mode = _mode(mode)
    _release()
    settings = Settings.from_options(options or {})
    owner = context.current_context()
    current = owner.device
    if current is not None and (current.mode, current.settings) == (mode, settings):
        return module
    _register()
    torch.autograd.set_multithreading_enabled(False)  # this thread runs the device's backward (see above)
    owner.release_device()  # what the device left pending runs in its mode
    owner.counted_memory().set_target(settings.target)  # every device tensor and every recipe run counts now
    owner.device = Device(mode, settings, release.release(), owner.lazy.for_device(settings), owner.ledger)
    # The device is a front end like the others: it compiles in the session in use, else the process's (the one
    # its lazy graphs are handed to), and its context records the runs of its graphs there.
    session_for(settings).observe_runs(context.on_device_run)
    return module


def report() -> dict:
    """What the run did on the device (``report.py``): mode, target, per-step ops, graphs, recipes compiled and
    estimated device time, recompiles, CPU fallbacks, host syncs, peak memory against HBM. JSON-ready."""
    device = context.current_device()
    return reporting.build(device, context.current_context())


def write_trace(path: str, rank: int | None = None) -> None:
    """Write the run's step timeline so far as a Chrome/Perfetto trace (``timeline/trace.py``) to ``path``;
    ``TraceError`` (one line) when it cannot be written."""
    device = context.current_device()
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    schedule = whatif.schedule(device.timeline.events, device.settings.target, spans=True)
    trace.write(path, schedule.spans, rank, {"target": device.settings.target, "mode": device.mode,
                                             "truncated": device.timeline.truncated})


def current() -> Device | None:
    """The enabled device of the context in use (None before ``enable()``)."""
    return context.enabled_device()


def _release() -> None:
    try:
        release.release()
    except release.ReleaseError as e:
        raise DeviceSetupError(str(e)) from None


def _mode(mode: str | None) -> str:
    if mode is None:
        try:
            return release.mode_from_env()
        except release.ReleaseError as e:
            raise DeviceSetupError(str(e)) from None
    if mode not in MODES:
        raise DeviceSetupError(f"hpu device mode {mode!r}: use one of {', '.join(MODES)}")
    return mode


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATE_USE1 = torch._C._autograd.DeviceType.PrivateUse1
# A C function that does nothing, called through ctypes' Python API library: ctypes raises the exception pending
# in this thread, if any, when the call returns (documented for ``ctypes.pythonapi``).
_RAISE_PENDING = ctypes.pythonapi.Py_IsInitialized
_RAISE_PENDING.argtypes, _RAISE_PENDING.restype = (), None


class _Guard(torch._C._acc.DeviceGuard):
    """torch's device guard for a backend written in Python: the backend's device type, asked for from C++.

    torch also asks while its autograd engine unwinds from a Python exception raised inside a backward (a tensor
    hook, a saved-tensor hook such as activation checkpointing's recomputation, a device op refused, e.g. out of
    memory), with that exception still pending: a Python call then fails inside a C++ function that may not
    throw, and the process aborts ("terminate called without an active exception"). So ``type_`` takes such an
    exception over, and the engine raises it from ``backward()`` (``_Engine``), as on a device backed by C++.

    The exception is kept on the class: torch takes one guard per process, and an instance attribute would give
    the guard a ``__dict__``, whose lookup fails while an exception is pending (torch then finds no ``type_``)."""

    lost: BaseException | None = None

    def type_(self):
        try:
            _RAISE_PENDING()
        except BaseException as exc:  # the backward's own error, not this call's: its traceback without this frame
            _Guard.lost = exc.with_traceback(exc.__traceback__.tb_next)
        return _PRIVATE_USE1


class _Engine(torch._C._ImperativeEngine):
    """torch's autograd engine; a backward that failed with an exception the device guard took over raises that
    exception (torch's engine reports only that it ended without one)."""

    def run_backward(self, *args, **kwargs):
        _Guard.lost = None
        try:
            return super().run_backward(*args, **kwargs)
        except SystemError:
            lost, _Guard.lost = _Guard.lost, None
            if lost is None:
                raise
            raise lost from None


def _no_tag(obj) -> None:
    return None  # device tensors save their host values (HpuTensor.__reduce_ex__): no storage is on the device


def _host_storage(storage, location: str):
    """Loading a checkpoint with ``map_location="hpu"``, of storages saved from host tensors: each stays in host
    memory (device tensors have no storage of their own), so those tensors load on the CPU; the checkpoint's
    device tensors, saved with their device, load on the device."""
    return storage if location.split(":")[0] == tensor.HPU else None


def _foreach_on_the_device() -> None:
    """Torch's optimizers (and ``clip_grad_norm_``) take their ``foreach`` path by default on a device whose
    tensors are plain tensors on a foreach device: Gaudi's are (``hpu`` is torch's PrivateUse1), so AdamW runs
    there as a dozen ``_foreach_*`` ops a step, not a dozen ops per parameter. The device's tensors are a
    subclass, which torch's type check would send down the per-parameter path: it is told they are tensors."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for kinds in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if tensor.HpuTensor not in kinds:
            kinds.append(tensor.HpuTensor)


def _fake_tracing_leaves_the_device_alone() -> None:
    """Fake tensors (Dynamo's tracing) run an op on constant inputs for real (constant propagation), except a move
    to a device they must not initialize, which torch decides by whether a real accelerator is present: the hpu
    device says it is. Its tensors are wrappers, which a fake tensor cannot hold as a constant (transformers'
    sliding-window cache moves a constant to ``x.device`` in the compiled graph: the trace failed), so fake
    tracing treats it as a device it need not initialize, as on a host without one: the move stays symbolic."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torchs = FakeTensorMode.avoid_device_init
    if getattr(torchs.fget, "simulated_hpu", False):
        return

    def avoid_device_init(self) -> bool:
        real = torch.cuda.is_available() or (torch.xpu._is_compiled() and torch.xpu.is_available())
        return torchs.fget(self) or not real

    avoid_device_init.simulated_hpu = True
    FakeTensorMode.avoid_device_init = property(avoid_device_init, doc=torchs.__doc__)


def _register() -> None:
    """Name PrivateUse1 ``hpu`` and install the module, methods and kernels (once per process)."""
    if context.registration() is not None:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name == "privateuseone":
        torch.utils.rename_privateuse1_backend(tensor.HPU)
    elif name != tensor.HPU:
        raise DeviceSetupError(f"torch's PrivateUse1 backend is already {name!r}; the hpu device cannot use it")
    if getattr(torch, tensor.HPU, None) is not module:
        torch._register_device_module(tensor.HPU, module)
    # What torch's C++ side asks a registered backend for (the current device of "hpu" without an index,
    # whether the device is available): torch's hooks for a backend written in Python.
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    torch.autograd.variable.Variable._execution_engine = _Engine()
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    torch.serialization.register_package(15, _no_tag, _host_storage)
    torch.utils.swap_tensors = swap.swap_tensors  # module.to("hpu") of weakly referenced parameters (swap.py)
    torch.Tensor.data = swap.data  # t.data = d across the host and the device moves t (swap.py)
    _foreach_on_the_device()
    _fake_tracing_leaves_the_device_alone()
    lib, every_op = torch.library.Library("aten", "IMPL"), torch.library.Library("_", "IMPL")
    kernels.register(lib, every_op)
    context.set_registration((lib, every_op))
