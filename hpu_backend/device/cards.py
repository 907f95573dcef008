"""The simulated cards: how many there are, and which one a device names (``torch.hpu.device_count``, ``hpu:N``).

``device_count()`` is ``HPU_SIM_CARDS`` when set, else the launcher's ``LOCAL_WORLD_SIZE`` or ``WORLD_SIZE``, else 1
(one simulated card per rank, as a server gives each rank its own card). A process uses one card, as a Gaudi
process uses the one module it acquired: ``hpu:N`` is checked against ``device_count()`` and names that card,
whose tensors are on ``hpu:0`` (``module.py`` says why).
"""

from __future__ import annotations

import os

import torch

HPU = "hpu"


def device_count() -> int:
    for name in ("HPU_SIM_CARDS", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def resolve(device: torch.device) -> torch.device:
    """``hpu`` or ``hpu:N`` as this process's device: ``hpu:0``, the one card it uses; RuntimeError for a card
    that does not exist."""
    index = device.index or 0
    if not 0 <= index < device_count():
        raise RuntimeError(f"hpu device {index} does not exist: device_count() is {device_count()} "
                           "(HPU_SIM_CARDS sets the simulated cards per process)")
    return torch.device(HPU, 0)
