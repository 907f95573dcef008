"""``torch.hpu.random`` (``habana_frameworks.torch.hpu.random``): the device's RNG functions under Intel's
submodule, plus ``default_generators``, one per card. The device draws from the host's generator (see
``module.py``), so each card's generator is ``torch.default_generator``."""

from __future__ import annotations

import torch

from .module import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all,  # noqa: F401
                     seed, seed_all, set_rng_state, set_rng_state_all)


def __getattr__(name: str):
    if name == "default_generators":  # as many as there are cards, which a launcher may change
        from .module import device_count

        return (torch.default_generator,) * device_count()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
