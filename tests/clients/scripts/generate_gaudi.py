"""Greedy generation with a tiny LLaMA and a tiny Qwen2-MoE, as Optimum's run_generation.py runs it:
``generate_gaudi.py DEVICE [graphs]``. Optimum Habana's ``adapt_transformers_to_gaudi()`` + ``generate()`` with
FusedSDPA (``use_flash_attention``), static shapes, lazy mode and, with ``graphs``, HPU graphs; DEVICE cpu runs the same
code on CPU tensors (the reference: Optimum's fused kernels are taken on hpu tensors only). Prompts come from the
locally trained tokenizer, of one length (6 tokens each). Prints each model's tokens and HPU graphs captured as
JSON."""

import copy
import json
import sys

import torch
import tiny
from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi

device = sys.argv[1]
graphs = "graphs" in sys.argv[2:]
tokenizer = tiny.tokenizer()
prompts = tokenizer(["a gaudi card runs the graph", "deep speed shards the optimizer state"], return_tensors="pt")
adapt_transformers_to_gaudi()
done = {}
for kind in ("llama", "qwen2_moe"):
    model = tiny.model(kind).eval().to(device)
    if graphs:
        from habana_frameworks.torch.hpu import wrap_in_hpu_graph

        model = wrap_in_hpu_graph(model)
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens, config.do_sample, config.pad_token_id = 8, False, tokenizer.pad_token_id
    config.use_cache, config.static_shapes, config.bucket_size, config.ignore_eos = True, True, -1, True
    config.use_flash_attention, config.flash_attention_recompute = True, False
    with torch.no_grad():
        out = model.generate(input_ids=prompts["input_ids"].to(device),
                             attention_mask=prompts["attention_mask"].to(device), generation_config=config,
                             lazy_mode=True, hpu_graphs=graphs)
    done[kind] = {"tokens": out.cpu().tolist(), "captures": getattr(model.__dict__.get("forward"), "captures", 0)}
print(json.dumps(done))
