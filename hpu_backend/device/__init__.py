"""The simulated ``hpu`` device: ``torch.device("hpu")`` tensors in host memory, with Gaudi's lazy and eager modes.

``enable()`` turns it on (never importing this package); ``report()`` summarizes what the run did on it.
"""

from .dispatch import DeviceFallbackError
from .setup import DeviceSetupError, current, enable, report, write_trace
from .tensor import HpuTensor

__all__ = ["DeviceFallbackError", "DeviceSetupError", "HpuTensor", "current", "enable", "report", "write_trace"]
