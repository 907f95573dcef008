"""One rank of a data-parallel training run (started twice by tests/test_ddp.py): ``python ddp_workers.py RANK
WORLD PORT BUCKET_MB STEPS`` trains models/gpt.py (tiny) under DistributedDataParallel over ``hccl`` (gloo on
the host), compiled with hpu_backend, gradients as views of the buckets, on its half of every global batch,
and prints as JSON its losses and parameters, the graphs Dynamo split the model into, DDP's buckets and the
plan of their all-reduces (hpu_backend.gaudi.ddp.BucketLog). With a sixth argument ``fsdp``: the same
training under FSDP2's ``fully_shard`` (each block, then the model), printing the gathered parameters."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
import gpt  # noqa: E402

import hpu_backend.gaudi  # noqa: E402
from hpu_backend.gaudi.ddp import BucketLog  # noqa: E402
from hpu_backend.serve.compiled import collect_recipes  # noqa: E402

hpu_backend.gaudi.register_hccl()  # backend="hccl", as a Gaudi script's import of distributed.hccl registers it

GLOBAL_BATCH, SEQ, LAYERS = 4, 16, 4  # 4 layers: about 1.5 MB of gradients, over 1 MB buckets (DDP's least)


def main(rank: int, world: int, port: int, bucket_mb: float, steps: int, mode: str = "ddp") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("hccl", rank=rank, world_size=world)
    if mode == "fsdp":  # FSDP2: every block's parameters sharded over the ranks, then the rest
        model = gpt.make_model(LAYERS)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
        return _fsdp(model, compiled, rank, world, steps)
    model = DDP(gpt.make_model(LAYERS), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    log = BucketLog.attach(model)
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    opt = hpu_backend.gaudi.FusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    share = GLOBAL_BATCH // world
    losses = []
    with collect_recipes() as found:
        for step in range(steps):
            tokens, targets = (t[rank * share:(rank + 1) * share] for t in gpt.make_inputs(GLOBAL_BATCH, SEQ, step))
            loss = gpt.loss(compiled(tokens), tokens, targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # the gradients stay views of DDP's buckets
            hpu_backend.gaudi.mark_step()
            losses.append(loss.item())
    views = all(p.grad is not None for p in model.parameters())
    recipes = {r.name: r for _, r, _ in found}
    backward_s = sum(r.facts["cost"]["total_s"] for r in recipes.values() if r.kind == "backward")
    by_cap = {cap: _eager_buckets(cap, rank, world).plan(backward_s) for cap in (0.25, 25.0)}
    dist.destroy_process_group()
    print(json.dumps({"backend": "hccl", "plan_by_bucket_mb": by_cap, "losses": losses, "grads_kept": views,
                      "params": {n: p.detach().flatten().tolist() for n, p in model.module.named_parameters()},
                      "forward_graphs": sorted(n for n, r in recipes.items() if r.kind == "forward"),
                      "bucket_calls": log.calls, "plan": log.plan(backward_s)}))


def _eager_buckets(bucket_mb: float, rank: int, world: int) -> BucketLog:
    """The buckets DDP all-reduces at ``bucket_mb`` (two uncompiled steps: DDP rebuilds its buckets after the
    first; Dynamo's DDP optimizer refuses buckets under its 1 MB first bucket, eager DDP takes them)."""
    model = DDP(gpt.make_model(LAYERS), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    log = BucketLog.attach(model)
    tokens, targets = (t[rank::world] for t in gpt.make_inputs(GLOBAL_BATCH, SEQ))
    for _ in range(2):
        log.buckets.clear()
        gpt.loss(model(tokens), tokens, targets).backward()
    return log


def _fsdp(model, compiled, rank: int, world: int, steps: int) -> None:
    opt = hpu_backend.gaudi.FusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    share = GLOBAL_BATCH // world
    with collect_recipes() as found:
        for step in range(steps):
            tokens, targets = (t[rank * share:(rank + 1) * share] for t in gpt.make_inputs(GLOBAL_BATCH, SEQ, step))
            gpt.loss(compiled(tokens), tokens, targets).backward()
            opt.step()
            opt.zero_grad()
    params = {n: p.full_tensor().detach().flatten().tolist() for n, p in model.named_parameters()}
    dist.destroy_process_group()
    ops = sorted({n.op for _, r, _ in found for n in r.nodes if n.op.startswith("_c10d")})
    print(json.dumps({"backend": "hccl", "params": params, "recipes": len(found), "collective_ops": ops}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:])
