"""One rank of a tensor-parallel run (started twice by tests/test_fabric.py): ``python fabric_workers.py RANK
WORLD PORT`` shards the tiny LLaMA and gpt with parallelize_module over ``hccl`` (gloo on the host), compiles
them with hpu_backend and prints, as JSON, each model's largest difference from its unsharded eager model
and the collectives its recipes list."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
import gpt  # noqa: E402
import llama  # noqa: E402

import hpu_backend.gaudi  # noqa: E402
from hpu_backend.serve.compiled import collect_recipes  # noqa: E402

hpu_backend.gaudi.register_hccl()  # backend="hccl", as a Gaudi script's import of distributed.hccl registers it


def llama_plan(model) -> dict:
    plan = {"head": ColwiseParallel(output_layouts=Replicate())}  # the logits gathered: an all_gather
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.attn.{n}": ColwiseParallel() for n in "qkv"})
        plan.update({f"blocks.{i}.{n}": ColwiseParallel() for n in ("gate", "up")})
        plan.update({f"blocks.{i}.attn.o": RowwiseParallel(), f"blocks.{i}.down": RowwiseParallel()})
    return plan


def gpt_plan(model) -> dict:
    plan = {}
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.mlp.0": ColwiseParallel(), f"blocks.{i}.mlp.2": RowwiseParallel()})
    return plan


def run(name: str, model, plan, inputs, mesh) -> dict:
    with torch.no_grad():
        expected = model(*inputs)
    model = parallelize_module(model, mesh, plan(model))
    compiled = torch.compile(model, backend="hpu_backend", options={"cache": False})
    with collect_recipes() as found, torch.no_grad():
        out = compiled(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    return {"max_diff": (out - expected).abs().max().item(),
            "collectives": [c for _, r, _ in found for c in r.facts["cost"].get("collectives", [])],
            "ops": sorted({n.op for _, r, _ in found for n in r.nodes if n.op.startswith("_c10d")})}


def main(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("hccl", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    tokens = llama.make_inputs(2, 8)
    result = {"backend": dist.get_backend(),
              "llama": run("llama", llama.make_model().eval(), llama_plan, tokens, mesh),
              "gpt": run("gpt", gpt.make_model().eval(), gpt_plan, gpt.make_inputs(2, 8)[:1], mesh)}
    dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
