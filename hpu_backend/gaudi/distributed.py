"""``init_process_group(backend="hccl")`` on the host: Gaudi's collective library name, backed by gloo.

Gaudi scripts import ``habana_frameworks.torch.distributed.hccl`` and initialize with ``backend="hccl"``;
``register_hccl()`` registers that name here (the launcher calls it when a script imports Intel's module),
so such a script runs unchanged. The collectives
then run through gloo over the host's network (the simulator's cards are processes); recipes estimate them
on the target's scale-up fabric (``hpu_backend.targets.Fabric``). The name is registered for the ``cpu``
and ``hpu`` devices, so that torch knows what the backend serves (and says nothing about an unknown device
capability) and ``dist.get_backend()`` answers ``hccl``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

BACKEND = "hccl"
DEVICES = ["cpu", "hpu"]
# Open MPI's names for what torchrun calls RANK, WORLD_SIZE and LOCAL_RANK (a script started by mpirun).
_FROM_MPI = {"OMPI_COMM_WORLD_RANK": "RANK", "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
             "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK"}


def _gloo(store, rank: int, world_size: int, timeout: timedelta):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register_hccl() -> None:
    """Register ``hccl`` as a torch.distributed backend (gloo underneath); calling it again does nothing."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _gloo, devices=DEVICES)


def initialize_distributed_hpu(world_size: int | None = None, rank: int | None = None,
                               local_rank: int | None = None) -> tuple[int, int, int]:
    """Gaudi's ``hccl.initialize_distributed_hpu``: ``(world_size, rank, local_rank)`` of this process, from the
    arguments when all three are given (they are written to the environment), else from torchrun's variables,
    else from Open MPI's (copied to torchrun's names); rank and local rank are -1 outside a launcher."""
    if None not in (world_size, rank, local_rank):
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local_rank))
    elif not all(name in os.environ for name in _FROM_MPI.values()) and all(k in os.environ for k in _FROM_MPI):
        os.environ.update({ours: os.environ[theirs] for theirs, ours in _FROM_MPI.items()})
    return (int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", -1)),
            int(os.environ.get("LOCAL_RANK", -1)))


