"""Greedy generation with a tiny LLaMA and a tiny Qwen2-MoE, as Optimum's run_generation.py runs it:
``generate_gaudi.py DEVICE [graphs]``. Optimum Habana's ``adapt_transformers_to_gaudi()`` + ``generate()`` with
FusedSDPA (``use_flash_attention``), static shapes, lazy mode and, with ``graphs``, HPU graphs; DEVICE cpu runs the same
code on CPU tensors (the reference: Optimum's fused kernels are taken on hpu tensors only). Prompts come from the
locally trained tokenizer, of one length (6 tokens each). Prints each model's tokens and HPU graphs captured as
JSON."""

import json
import sys

import tiny
from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi

device = sys.argv[1]
graphs = "graphs" in sys.argv[2:]
adapt_transformers_to_gaudi()
done = {}
for kind in ("llama", "qwen2_moe"):
    model = tiny.model(kind).eval().to(device)
    if graphs:
        from habana_frameworks.torch.hpu import wrap_in_hpu_graph

        model = wrap_in_hpu_graph(model)
    tokens = tiny.gaudi_greedy(model, device, lazy_mode=True, hpu_graphs=graphs)
    done[kind] = {"tokens": tokens, "captures": getattr(model.__dict__.get("forward"), "captures", 0)}
print(json.dumps(done))
