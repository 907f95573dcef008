"""Fine-tune a tiny model: ``train_gaudi.py MODEL DEVICE MODE OUT [fused]`` (MODEL gpt2|llama; DEVICE hpu|cpu; MODE
lazy|eager|compile). On hpu: Optimum Habana's GaudiTrainer with Gaudi's fused AdamW and clipping, as a Gaudi user
runs it. On cpu: transformers' own Trainer with the same arguments (the reference). Writes the trained weights
(on the CPU) and the logged losses to OUT."""

import sys

import torch
import torch._dynamo.utils
import tiny

kind, device, mode, out = sys.argv[1:5]
fused = "fused" in sys.argv[5:]  # Gaudi's FusedAdamW and FusedClipNorm, as Optimum's examples configure
common = dict(output_dir=out + ".d", per_device_train_batch_size=2, max_steps=3, logging_steps=1, learning_rate=1e-3,
              report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0)
if device == "hpu":
    from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments

    args = GaudiTrainingArguments(use_habana=True, use_lazy_mode=mode == "lazy", torch_compile=mode == "compile",
                                  torch_compile_backend="hpu_backend" if mode == "compile" else None, **common)
    model = tiny.model(kind)  # after the arguments: they adapt transformers' classes to Gaudi's
    trainer = GaudiTrainer(model=model, args=args, train_dataset=tiny.dataset(),
                           gaudi_config=GaudiConfig(use_fused_adam=fused, use_fused_clip_norm=fused))
else:
    from transformers import Trainer, TrainingArguments

    model = tiny.model(kind)
    trainer = Trainer(model=model, args=TrainingArguments(use_cpu=True, **common), train_dataset=tiny.dataset())
trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
weights = {name: value.detach().cpu() for name, value in model.state_dict().items()}
graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # what torch.compile captured (0 without it)
torch.save({"kind": kind, "weights": weights, "losses": losses, "graphs": graphs}, out)
