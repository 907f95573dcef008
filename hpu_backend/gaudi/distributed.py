"""``init_process_group(backend="hccl")`` on the host: Gaudi's collective library name, backed by gloo.

Gaudi scripts import ``habana_frameworks.torch.distributed.hccl`` and initialize with ``backend="hccl"``;
importing ``hpu_backend.gaudi`` registers that name here so such a script runs unchanged. The collectives
then run through gloo over the host's network (the simulator's cards are processes); recipes estimate them
on the target's scale-up fabric (``hpu_backend.targets.Fabric``).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

BACKEND = "hccl"


def _gloo(store, rank: int, world_size: int, timeout: timedelta):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register_hccl() -> None:
    """Register ``hccl`` as a torch.distributed backend (gloo underneath); calling it again does nothing."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _gloo, devices=["cpu"])


register_hccl()
