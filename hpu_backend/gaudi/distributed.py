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
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

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


def is_collective(func) -> bool:
    """A c10d op (``torch.ops.c10d.allreduce_`` and the rest): what a process group runs for a collective."""
    return getattr(func, "namespace", None) == "c10d"


def collective_on_host(func, args: tuple, kwargs: dict,
                       host_of: Callable[[torch.Tensor], torch.Tensor | None]) -> Any:
    """Run a c10d op for device tensors on their host tensors: gloo (the ``cpu`` backend of the ``hccl``
    group) reads and writes those in place, so the device tensors see the result; the device tensors are
    given back where the op returns its inputs. ``host_of(t)`` is the host tensor of a device tensor, with
    its pending work done (None for any other tensor)."""
    device_of: dict[int, torch.Tensor] = {}

    def down(t: torch.Tensor) -> torch.Tensor:
        host = host_of(t)
        if host is None:
            return t
        device_of[id(host)] = t
        return host

    out = func(*pytree.tree_map_only(torch.Tensor, down, args), **pytree.tree_map_only(torch.Tensor, down, kwargs))
    return pytree.tree_map_only(torch.Tensor, lambda t: device_of.get(id(t), t), out)
