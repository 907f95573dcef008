"""Fine-tune tiny models: ``train_gaudi.py DEVICE MODE OUT KINDS [fused] [graphs] [checkpointing]`` (DEVICE
hpu|cpu; MODE lazy|eager|compile; KINDS gpt2, llama or both, comma-separated, trained one after the other in this
process). On hpu: Optimum Habana's GaudiTrainer, as a Gaudi user runs it (``fused``: Gaudi's fused AdamW and
clipping; ``graphs``: ``use_hpu_graphs_for_training``). On cpu: transformers' own Trainer with the same arguments
(the reference). ``checkpointing``: ``gradient_checkpointing``, on either. Under a launcher of several ranks each
rank trains on its share of every batch (data parallelism); rank 0 writes, per kind, the trained weights (on the
CPU), the logged losses, what graphs were made and whether checkpointing was on, to OUT."""

import os
import sys

import torch
import torch._dynamo.utils
import tiny

device, mode, out, kinds = sys.argv[1:5]
fused, graphs, checkpointing = ("fused" in sys.argv[5:], "graphs" in sys.argv[5:], "checkpointing" in sys.argv[5:])
result = {}
for kind in kinds.split(","):
    common = dict(output_dir=f"{out}.{kind}.d", per_device_train_batch_size=2, max_steps=3, logging_steps=1,
                  learning_rate=1e-3, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
                  gradient_checkpointing=checkpointing)
    if device == "hpu":
        from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments

        args = GaudiTrainingArguments(use_habana=True, use_lazy_mode=mode == "lazy", torch_compile=mode == "compile",
                                      torch_compile_backend="hpu_backend" if mode == "compile" else None,
                                      use_hpu_graphs_for_training=graphs, **common)
        model = tiny.model(kind)  # after the arguments: they adapt transformers' classes to Gaudi's
        trainer = GaudiTrainer(model=model, args=args, train_dataset=tiny.dataset(),
                               gaudi_config=GaudiConfig(use_fused_adam=fused, use_fused_clip_norm=fused))
    else:
        from transformers import Trainer, TrainingArguments

        model = tiny.model(kind)
        trainer = Trainer(model=model, args=TrainingArguments(use_cpu=True, **common), train_dataset=tiny.dataset())
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    trainer.train()
    wrapped = [m.forward for m in (trainer.model_wrapped, trainer.model) if hasattr(m.__dict__.get("forward"),
                                                                                 "captures")]
    result[kind] = {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "weights": {name: value.detach().cpu() for name, value in model.state_dict().items()},
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - before,  # what torch.compile captured
        "hpu_graphs": [(f.captures, f.replays) for f in wrapped],  # ModuleCacher's signatures and replays
        "checkpointing": model.is_gradient_checkpointing,
        "world": int(os.environ.get("WORLD_SIZE", "1"))}
if os.environ.get("RANK", "0") == "0":
    torch.save(result, out)
