"""``torch.hpu``: the device module of the simulated hpu device (registered by ``hpu_backend.device.enable``).

The names Gaudi scripts call on ``torch.hpu`` / ``habana_frameworks.torch.hpu``, and the hooks torch asks a
PrivateUse1 device module for (``_is_in_bad_fork``, ``get_amp_supported_dtype``, the RNG state, ``device``).

- Cards (``cards.py``): ``device_count()`` is ``HPU_SIM_CARDS`` when set, else the launcher's ``LOCAL_WORLD_SIZE`` or
  ``WORLD_SIZE``, else 1 (one simulated card per rank, as a server gives each rank its own card). A process
  uses one card, as a Gaudi process uses the one module it acquired: ``set_device(N)`` and ``hpu:N`` are checked
  against ``device_count()`` and name that card, whose tensors are on ``hpu:0``. (torch's autograd engine
  queues a Python-side backend's work for one device only, so a tensor on ``hpu:1`` could not run a backward.)
- Random numbers: the device's generator is the host's (ops run on host tensors), so ``manual_seed`` seeds
  it, and a seeded script draws the same numbers on the device as on the CPU (``random.py``).
- HPU graphs: ``HPUGraph`` (``capture_begin``/``capture_end``/``replay``) and ``graph(g)`` (``graphs.py``).
- Memory: ``memory_allocated`` and friends read the device context's memory (``memory.py``, ``context.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from . import random  # noqa: F401  (``torch.hpu.random``, Intel's RNG submodule)
from .cards import device_count, resolve  # noqa: F401  (torch.hpu's names)
from .context import current_context, enabled_device
from .graphs import HPUGraph, graph  # noqa: F401  (torch.hpu's explicit HPU-graph capture)
from .random import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all,  # noqa: F401
                     seed, seed_all, set_rng_state, set_rng_state_all)
from .tensor import HPU

_NAMES = {"gaudi2": "GAUDI2", "gaudi3": "GAUDI3"}


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """Nothing to initialize: the simulated device is ready once enabled."""


def current_device() -> int:
    """This process's card: always device 0 (see the module's docstring)."""
    return 0


def set_device(device) -> None:
    """Use card ``device`` (a rank's ``LOCAL_RANK``): checked, and it is this process's card, ``hpu:0``."""
    resolve(torch.device(HPU, device) if isinstance(device, int) else torch.device(device))


def target() -> str:
    """The target the enabled device simulates (``gaudi2`` before ``enable()``)."""
    device = enabled_device()
    return device.settings.target if device is not None else "gaudi2"


def get_device_name(device=None) -> str:
    return _NAMES[target()]


def synchronize(device=None) -> None:
    """Wait for the device's work: ops run on the host as they are launched, so nothing is outstanding."""


@contextlib.contextmanager
def device(index):
    """The block runs on card ``index`` (torch's loader uses this to place storages): this process's card."""
    set_device(index)
    yield


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int


def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(get_device_name(device), _memory().capacity())


# -- streams and events: host-synchronous (an op has run when its call returns) -------------------------------------

class Stream(torch.Stream):
    """A device stream (a ``torch.Stream``, so ``Tensor.record_stream`` takes it). Work runs as it is issued, so a
    stream has nothing outstanding."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=resolve(torch.device(device if device is not None else HPU)),
                               priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def synchronize(self) -> None:
        """Nothing is outstanding."""

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: "Stream") -> None:
        """Streams are already in order."""

    def wait_event(self, event: "Event") -> None:
        """Events are already complete."""


def current_stream(device=None) -> Stream:
    context = current_context()
    if context.stream is None:
        context.stream = Stream(device)
    return context.stream


default_stream = current_stream


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


class Event:
    """A timing event: ``record()`` takes the host clock, ``elapsed_time(end)`` is in milliseconds, as torch's."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        """A recorded event is complete."""

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end: "Event") -> float:
        if self.time is None or end.time is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end.time - self.time) * 1e3


# -- memory: the device context's (one card per rank), so ``device`` only names the card asked about ----------------

def _memory():
    return current_context().counted_memory()


def memory_allocated(device=None) -> int:
    """Bytes of device memory held now by the device's tensors and those of the recipes that ran."""
    return _memory().allocated()


def max_memory_allocated(device=None) -> int:
    """The largest ``memory_allocated()`` since the start or ``reset_peak_memory_stats()``, arenas included."""
    return _memory().max_allocated()


def reset_peak_memory_stats(device=None) -> None:
    """Start the peak over from the memory held now."""
    _memory().reset_peak()


reset_max_memory_allocated = reset_peak_memory_stats  # DeepSpeed's accelerator calls Intel's older name


def memory_stats(device=None) -> dict:
    """Gaudi's keys: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize."""
    return _memory().memory_stats()


def mem_get_info(device=None) -> tuple[int, int]:
    return _memory().mem_get_info()


def memory_cached(device=None) -> int:
    """Intel's older name of ``memory_reserved``."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    return max_memory_reserved(device)


def memory_reserved(device=None) -> int:
    return memory_allocated()


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated()


def empty_cache() -> None:
    """The simulated allocator holds no cache: freed storages leave the count at once."""


# -- hooks torch asks a PrivateUse1 module for ---------------------------------------------------------------------

def _is_in_bad_fork() -> bool:
    return False


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("hpu")


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("hpu")


def is_autocast_hpu_enabled() -> bool:
    """Intel's name of ``is_autocast_enabled`` (Optimum Habana asks it before casting)."""
    return is_autocast_enabled()


def get_autocast_hpu_dtype() -> torch.dtype:
    return get_autocast_dtype()


# -- dynamic shapes: the backend compiles shape buckets and recompiles on its own --------------------------------

def enable_dynamic_shape() -> None:
    """Gaudi's switch for its graph compiler's dynamic-shape support; here buckets are chosen per recipe
    (``hpu_backend/buckets.py``), so the switch changes nothing."""


def disable_dynamic_shape() -> None:
    """See ``enable_dynamic_shape``."""

