"""Optimum's Gaudi generation across architectures: ``generate_architectures.py DEVICE [compile]``. Fifteen
tiny causal LMs from configs (2 layers, hidden 64, seeded), each adapted by ``adapt_transformers_to_gaudi()``
(Optimum's Gaudi classes, as ``from_pretrained`` gives) and run through Optimum's greedy ``generate()`` with
static shapes and ``use_flash_attention`` (FusedSDPA, fused RoPE and RMSNorm on the device; the MoE kernel for
Mixtral and Qwen2-MoE); ``compile``: the model compiled with ``backend="hpu_backend"`` first. DEVICE cpu is the
reference: the same code on CPU tensors. Prints ``{architecture: tokens}`` as JSON."""

import json
import sys

import torch
import transformers as tf
import tiny
from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi

SIZES = dict(vocab_size=tiny.VOCAB, max_position_embeddings=64)
LAYERS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
GQA = dict(LAYERS, num_key_value_heads=2)
EXPERTS = dict(num_experts_per_tok=2)
CONFIGS = {
    "llama": tf.LlamaConfig(**GQA, **SIZES),
    "mistral": tf.MistralConfig(**GQA, sliding_window=None, **SIZES),
    "qwen2": tf.Qwen2Config(**GQA, **SIZES),
    "gpt2": tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=tiny.VOCAB, n_positions=64),
    "falcon": tf.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=tiny.VOCAB,
                              new_decoder_architecture=False, multi_query=True),
    "gpt_neox": tf.GPTNeoXConfig(**LAYERS, **SIZES),
    "opt": tf.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                        word_embed_proj_dim=64, **SIZES),
    "bloom": tf.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=tiny.VOCAB),
    "phi": tf.PhiConfig(**LAYERS, **SIZES),
    "gemma": tf.GemmaConfig(**GQA, head_dim=16, **SIZES),
    "mixtral": tf.MixtralConfig(**GQA, num_local_experts=4, **EXPERTS, **SIZES),
    "gptj": tf.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=tiny.VOCAB, n_positions=64),
    "starcoder2": tf.Starcoder2Config(**GQA, **SIZES),
    "stablelm": tf.StableLmConfig(**GQA, **SIZES),
    "qwen2_moe": tf.Qwen2MoeConfig(**GQA, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                   num_experts=4, **EXPERTS, **SIZES),
}

device = sys.argv[1]
compiled = "compile" in sys.argv[2:]
adapt_transformers_to_gaudi()
if device == "cpu":
    # Optimum's Mistral and Mixtral take a CPU branch that passes position_ids where transformers 4.55's
    # apply_rotary_pos_emb takes unsqueeze_dim: the reference indexes the angles by position first, as the
    # device's fused RoPE does.
    from optimum.habana.transformers.models.mistral import modeling_mistral
    from optimum.habana.transformers.models.mixtral import modeling_mixtral
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    def rope(q, k, cos, sin, position_ids, training=True):
        return apply_rotary_pos_emb(q, k, cos[position_ids], sin[position_ids])

    modeling_mistral.apply_customized_rope = modeling_mixtral.apply_customized_rope = rope

done = {}
for name, config in CONFIGS.items():
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval().to(device)
    if compiled:
        model = torch.compile(model, backend="hpu_backend")
    done[name] = tiny.gaudi_greedy(model, device, lazy_mode=not compiled)
print(json.dumps(done))
