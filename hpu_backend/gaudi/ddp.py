"""DistributedDataParallel's gradient buckets, as they run and as the plan costs them.

DDP all-reduces each gradient bucket from an autograd hook once the bucket's gradients are all computed:
outside every graph Dynamo traces (Dynamo's DDP optimizer splits the forward at bucket boundaries so that
each bucket's backward ends early, but the all-reduces themselves are not in any recipe). ``BucketLog``
is a DDP communication hook that records each bucket's size and then all-reduces it exactly as DDP's
default hook does (the average over the group); ``plan(backward_s)`` costs those all-reduces on the
target's scale-up fabric and says how much of each the backward hides.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..targets import fabric


class BucketLog:
    """``BucketLog.attach(ddp_model)``: record every gradient bucket DDP all-reduces (index, bytes)."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.buckets: dict[int, int] = {}  # bucket index -> bytes (the last step's)
        self.calls = 0

    @classmethod
    def attach(cls, model: torch.nn.parallel.DistributedDataParallel) -> "BucketLog":
        log = cls(model.process_group)
        model.register_comm_hook(log, _hook)
        return log

    def plan(self, backward_s: float, target: str = "gaudi2") -> dict[str, Any]:
        world = dist.get_world_size(self.group)
        return bucket_plan([self.buckets[i] for i in sorted(self.buckets)], world, target, backward_s)


def _hook(log, bucket):  # unannotated: DDP compares annotations with dist.GradBucket itself
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffer = bucket.buffer()
    log.buckets[bucket.index()] = buffer.numel() * buffer.element_size()
    log.calls += 1
    return allreduce_hook(log.group, bucket)


def bucket_plan(bucket_bytes: list[int], world: int, target: str, backward_s: float) -> dict[str, Any]:
    """Each gradient bucket's all-reduce (bytes, estimated time) and how much of it the backward (``backward_s``,
    its recipes' estimate) hides. Buckets are ready in DDP's order (index 0 first, the last layers' gradients)
    as the backward computes their share of the gradients (by bytes); the all-reduces run one after another."""
    net, total = fabric(target), max(sum(bucket_bytes), 1)
    rows, ready, busy_until = [], 0.0, 0.0
    for nbytes in bucket_bytes:
        ready += backward_s * nbytes / total
        start = max(ready, busy_until)
        seconds = net.collective_s("all_reduce", nbytes, world)
        busy_until = start + seconds
        rows.append({"kind": "all_reduce", "bytes": nbytes, "est_s": seconds,
                     "hidden_s": max(min(busy_until, backward_s) - start, 0.0)})
    return {"collectives": rows, "comm_s": sum(r["est_s"] for r in rows), "backward_s": backward_s,
            "exposed_s": max(busy_until - backward_s, 0.0), "group_size": world, "estimate": True}
