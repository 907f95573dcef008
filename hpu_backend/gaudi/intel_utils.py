"""The small Intel bridge utilities Optimum Habana and DeepSpeed query, over the simulated device.

===================================================  =================================================
Intel (``habana_frameworks.torch``)                  here
===================================================  =================================================
``utils.experimental._get_device_type()``            the planned target as a ``synDeviceType`` member
``utils.experimental.synDeviceType``                 ``synDeviceGaudi``/``Gaudi2``/``Gaudi3`` (members are
                                                     compared, never their numbers)
``utils.experimental._is_fp16_supported()``          True from Gaudi2 on (first-generation Gaudi had none)
``utils.internal.is_lazy()``                         the device runs in lazy mode (``PT_HPU_LAZY_MODE``)
``core.step_closure._mark_step_if_lazy()``           ``mark_step()`` in lazy mode, nothing in eager mode
``core.hpu_set_env()``                               nothing to set: Intel's applies its bridge variables
``habana_dataloader.HabanaDataLoader``               torch's ``DataLoader`` (Intel's own fallback)
===================================================  =================================================
"""

from __future__ import annotations

import enum
import types

import torch

from . import training


class synDeviceType(enum.IntEnum):  # noqa: N801 - Intel's name
    synDeviceGaudi = 1
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3


_TARGETS = {"gaudi2": synDeviceType.synDeviceGaudi2, "gaudi3": synDeviceType.synDeviceGaudi3}


def _get_device_type() -> synDeviceType:
    from ..device import module

    return _TARGETS[module.target()]


def _is_fp16_supported() -> bool:
    return _get_device_type() != synDeviceType.synDeviceGaudi


def is_lazy() -> bool:
    """Whether the enabled device runs lazily (Intel's ``utils.internal.is_lazy``)."""
    from ..device import context

    device = context.enabled_device()
    return device is not None and device.mode == "lazy"


def _mark_step_if_lazy() -> None:
    if is_lazy():
        training.mark_step()


# ``core.step_closure``: Intel's module of that name; DeepSpeed calls its ``_mark_step_if_lazy``.
step_closure = types.SimpleNamespace(_mark_step_if_lazy=_mark_step_if_lazy)


def hpu_set_env() -> None:
    """Intel's applies its bridge's environment defaults before a pipeline's first graph; the simulated
    device reads its variables when it is enabled, so there is nothing left to set."""


class HabanaDataLoader(torch.utils.data.DataLoader):
    """``habana_dataloader.HabanaDataLoader``: Intel's documents it falls back to torch's DataLoader for
    datasets its media pipeline does not accelerate; the simulator has no media pipeline, so it always does."""
