"""``torch.hpu``: the device module of the simulated hpu device (registered by ``hpu_backend.device.enable``).

The names Gaudi scripts call on ``torch.hpu`` / ``habana_frameworks.torch.hpu``, and the hooks torch asks a
PrivateUse1 device module for (``_is_in_bad_fork``, ``get_amp_supported_dtype``, the RNG state, ``device``).

- Cards: ``device_count()`` is ``HPU_SIM_CARDS`` when set, else the launcher's ``LOCAL_WORLD_SIZE`` or
  ``WORLD_SIZE``, else 1 (one simulated card per rank, as a server gives each rank its own card).
- Random numbers: the device's generator is the host's (ops run on host tensors), so ``manual_seed`` seeds
  it, and a seeded script draws the same numbers on the device as on the CPU.
- Memory: ``memory_allocated`` and friends read the device allocator (``gaudi/memory.py``).
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..gaudi import memory
from . import tensor
from ..gaudi.memory import (max_memory_allocated, mem_get_info, memory_allocated, memory_stats,  # noqa: F401
                            reset_peak_memory_stats)

_current = [0]
_names = {"gaudi2": "GAUDI2", "gaudi3": "GAUDI3"}
TARGET = ["gaudi2"]  # set by enable()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """Nothing to initialize: the simulated device is ready once enabled."""


def device_count() -> int:
    for name in ("HPU_SIM_CARDS", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def current_device() -> int:
    return _current[0]


def set_device(device) -> None:
    index = _index(device)
    if not 0 <= index < device_count():
        raise ValueError(f"hpu device {index} does not exist: device_count() is {device_count()}")
    _current[0] = index


def _index(device) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else _current[0]


def get_device_name(device=None) -> str:
    return _names[TARGET[0]]


def synchronize(device=None) -> None:
    """Wait for the device's work: ops run on the host as they are launched, so nothing is outstanding."""


@contextlib.contextmanager
def device(index):
    """Make ``index`` the current device for the block (torch's loader uses this to place storages)."""
    previous = _current[0]
    set_device(index)
    try:
        yield
    finally:
        _current[0] = previous


# -- memory ---------------------------------------------------------------------------------------------------

def memory_reserved(device=None) -> int:
    return memory.memory_allocated()


def max_memory_reserved(device=None) -> int:
    return memory.max_memory_allocated()


def empty_cache() -> None:
    """The simulated allocator holds no cache: freed storages leave the count at once."""


# -- random numbers: the host's generator ------------------------------------------------------------------------

def manual_seed(seed: int) -> None:
    """Seed the device's generator. Pending lazy work draws its random numbers first: it was issued before the
    seed (``torch.manual_seed`` calls this after seeding the host, so the flush draws from the new seed: the
    numbers a pending op would have drawn had it run at once)."""
    device = tensor.DISPATCH[0]
    if device is not None:
        device.flush("manual_seed")
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


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
