"""``torch.hpu.random`` (``habana_frameworks.torch.hpu.random``): the device's random numbers, plus
``default_generators``, one per card. The device's ops run on host tensors, so its generator is the host's:
``manual_seed`` seeds it, and a seeded script draws the same numbers on the device as on the CPU.
"""

from __future__ import annotations

import torch

from .cards import device_count
from .context import enabled_device


def manual_seed(seed: int) -> None:
    """Seed the device's generator. Pending lazy work draws its random numbers first: it was issued before the
    seed (``torch.manual_seed`` calls this after seeding the host, so the flush draws from the new seed: the
    numbers a pending op would have drawn had it run at once)."""
    device = enabled_device()
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


def __getattr__(name: str):
    if name == "default_generators":  # as many as there are cards, which a launcher may change
        return (torch.default_generator,) * device_count()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
