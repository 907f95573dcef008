"""A tensor-parallel inference server's start-up, as every rank runs it.

Each rank joins the ``hccl`` group, builds its shard of a model file (the file's ``PER_CARD`` over the world's
cards, collectives over the world group), compiles it and runs every shape point of the file's axes once, as a
server warms up before it takes requests. After ``hpurecipe warm MODEL --cards N`` (or ``prebuild``) filled the
cache, no rank compiles anything: each rank's report says so on its ``recipe cache`` line.

    hpurecipe warm models/llama.py:TINY_TP --cards 8
    hpurecipe run --cards 8 models/gaudi/serve_tp.py models/llama.py:TINY_TP

Arguments: the model file, then ``NAME=V1,V2`` for each axis to cover other values on (as ``--axis``);
``--check`` compares every output with the eager shard's (exit 1 on a difference).
"""

import sys

import torch
import torch.distributed as dist

import habana_frameworks.torch.distributed.hccl  # noqa: F401  (the hccl backend)
from hpu_backend import load_model_file
from hpu_backend.shipping.warm import card_spec


def axes(args: list[str]) -> dict[str, list[int]]:
    return {name: [int(v) for v in values.split(",")] for name, _, values in (a.partition("=") for a in args)}


def main(argv: list[str]) -> None:
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    if not argv:
        sys.exit("usage: serve_tp.py MODEL_FILE [AXIS=V1,V2 ...] [--check]")
    dist.init_process_group("hccl")
    spec = load_model_file(argv[0]).with_axes(axes(argv[1:]))
    card = card_spec(spec, dist.get_world_size(), dist.group.WORLD.group_name)
    model = card.build_model().eval()  # a deployment loads this rank's shard of the checkpoint here
    compiled = torch.compile(model, backend="hpu_backend", dynamic=card.dynamic, options=dict(card.options))
    with torch.no_grad():
        for point in card.points():
            inputs = card.split(card.inputs(point))
            out = compiled(*inputs)
            if check:
                torch.testing.assert_close(out, model(*inputs), msg=lambda m: f"rank {dist.get_rank()} {point}: {m}")
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks served {len(card.points())} shape points of {card.name}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
