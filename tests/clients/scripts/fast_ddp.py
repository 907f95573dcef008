"""Optimum Habana's fast DDP (``all_reduce_gradients``: gradients packed into a fused buffer by one HPU graph,
all-reduced with ``async_op=True`` and unpacked by another) for three steps on every rank, each step's averaged
gradients compared with the CPU's average of all ranks' gradients. Prints JSON: the steps checked."""

import copy
import json
import sys

import habana_frameworks.torch.core as htcore
import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers backend="hccl")
import torch
import torch.distributed as dist
from optimum.habana.distributed.fast_ddp import all_reduce_gradients

dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
on_device = copy.deepcopy(model).to("hpu")
steps = 0
for step in range(3):
    batches = [torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + r)) for r in range(world)]
    model.zero_grad()
    for batch in batches:  # the CPU's reference: the gradients of every rank's batch
        model(batch).square().sum().backward()
    on_device.zero_grad(set_to_none=False)  # the same gradient tensors every step, as fast DDP requires
    on_device(batches[rank].to("hpu")).square().sum().backward()
    all_reduce_gradients(on_device)  # bfloat16 fusion buffer, HPU graphs
    htcore.mark_step()
    for p, q in zip(model.parameters(), on_device.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad / world, rtol=2e-2, atol=2e-2)
    steps += 1
assert type(on_device._all_reduce_gradient_pack_graph).__name__ == "HPUGraph"
sys.stdout.write(json.dumps({"rank": rank, "steps": steps}) + "\n")  # one write: the ranks share the output
