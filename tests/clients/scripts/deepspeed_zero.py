"""DeepSpeed ZeRO on a small MLP: ``deepspeed_zero.py DEVICE STAGE OUT [WORLD | compile]``. On hpu
(``DS_ACCELERATOR=hpu``, under the launcher, one process per rank): ``deepspeed.initialize`` with ZeRO stage STAGE
and DeepSpeed's ``FusedAdam`` (``torch.ops.hpu.optimizer_adamw`` on Gaudi), three steps (``compile``: the engine
compiled with ``engine.compile()``, whose backend DeepSpeed's HPU accelerator names: ``hpu_backend``); rank 0
writes every rank's losses and the optimizer's class to OUT. On cpu: the reference, one process, plain torch:
the same model, data, clipping and AdamW step over all WORLD ranks' batches at once (data parallelism averages
the ranks' gradients)."""

import json
import os
import sys

import torch

LR, WD, CLIP, STEPS, BATCH = 1e-2, 0.01, 1.0, 3, 4


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def on_hpu(stage: int, compiled: bool) -> dict:
    import deepspeed

    net = model()
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "Adam", "params": {"lr": LR, "weight_decay": WD}},
              "gradient_clipping": CLIP, "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    if compiled:
        engine.compile()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    losses = []
    for step in range(STEPS):
        x, y = (t.to(engine.device) for t in batch(rank, step))
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    every = [None] * world
    torch.distributed.all_gather_object(every, losses)
    return {"losses": every, "optimizer": type(engine.basic_optimizer).__name__, "device": str(engine.device),
            "compiled": engine.is_compiled}


def on_cpu(world: int) -> dict:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD, eps=1e-8)
    losses = [[] for _ in range(world)]
    for step in range(STEPS):
        per_rank = [torch.nn.functional.mse_loss(net(x), y) for x, y in (batch(r, step) for r in range(world))]
        for rank, loss in enumerate(per_rank):
            losses[rank].append(loss.item())
        optimizer.zero_grad()
        (sum(per_rank) / world).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        optimizer.step()
    return {"losses": losses}


if __name__ == "__main__":
    device, stage, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    result = on_hpu(stage, sys.argv[4:] == ["compile"]) if device == "hpu" else on_cpu(int(sys.argv[4]))
    if os.environ.get("RANK", "0") == "0":
        with open(out, "w") as f:
            json.dump(result, f)
