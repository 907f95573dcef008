"""DeepSpeed inference with automatic tensor parallelism: ``deepspeed_inference.py``, one process per rank under
the launcher (``DS_ACCELERATOR=hpu``). ``deepspeed.init_inference(tensor_parallel={"tp_size": WORLD})`` on a tiny
LLaMA built on the CPU: AutoTP shards each linear layer's weights onto the rank's card (``param.data =
shard.to(device)``) and all-reduces the row-parallel outputs; then greedy ``generate()`` on the device. Rank 0
prints its tokens and those of transformers' own ``generate()`` of the unsharded model on the CPU, as JSON."""

import json
import os

import deepspeed
import torch
import tiny

tokenizer = tiny.tokenizer()
prompts = tokenizer(tiny.PROMPTS, return_tensors="pt")
model = tiny.model("llama").eval()
settings = dict(max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
with torch.no_grad():
    cpu = model.generate(**prompts, **settings)
world = int(os.environ["WORLD_SIZE"])
engine = deepspeed.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": world},
                                  replace_with_kernel_inject=False)
device = torch.device("hpu")
sharded = engine.module.model.layers[0].self_attn.q_proj.weight
with torch.no_grad():
    out = engine.module.generate(**{k: v.to(device) for k, v in prompts.items()}, **settings)
if int(os.environ["RANK"]) == 0:
    print(json.dumps({"hpu": out.cpu().tolist(), "cpu": cpu.tolist(), "world": world,
                      "shard": [str(sharded.device), list(sharded.shape)]}))
