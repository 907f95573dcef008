"""The simulated ``hpu`` device: ``torch.device("hpu")`` tensors in host memory, with Gaudi's lazy and eager modes.

``enable()`` turns it on (never importing this package); ``report()`` summarizes what the run did on it. Its state
has one owner, the device context (``context.py``): ``current_context()`` is the one in use, ``fresh_context()``
opens a new one for a block.
"""

from .context import DeviceContext, DeviceSetupError, current_context, fresh_context
from .dispatch import DeviceFallbackError
from .setup import current, enable, report, write_trace
from .tensor import HpuTensor

__all__ = ["DeviceContext", "DeviceFallbackError", "DeviceSetupError", "HpuTensor", "current", "current_context",
           "enable", "fresh_context", "report", "write_trace"]
