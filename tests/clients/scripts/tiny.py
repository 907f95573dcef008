"""Tiny models from configs and a tokenizer trained here, for the client scripts (no downloads)."""

import copy

import torch
import transformers.models.gpt2.modeling_gpt2 as gpt2
import transformers.models.llama.modeling_llama as llama
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GPT2Config, LlamaConfig, PreTrainedTokenizerFast, Qwen2MoeConfig
from transformers.models.qwen2_moe import modeling_qwen2_moe as qwen2_moe

CORPUS = ["the quick brown fox jumps over the lazy dog", "a gaudi card runs the graph the bridge compiled",
          "deep speed shards the optimizer state across the ranks", "optimum trains and generates on the card",
          "every step ends with a mark step in lazy mode"] * 4
VOCAB = 128


def tokenizer() -> PreTrainedTokenizerFast:
    """A BPE tokenizer of ``VOCAB`` tokens trained on ``CORPUS``; like LLaMA's, it gives no ``token_type_ids``."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<unk>", "<s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="<s>", model_input_names=["input_ids", "attention_mask"])


def model(kind: str) -> torch.nn.Module:
    """A 2-layer model of hidden size 64, seeded: the same weights in every process. No dropout: its draws are
    not what the comparison is about. The class is looked up now: after ``adapt_transformers_to_gaudi()``
    (Optimum's arguments call it) it is Optimum's Gaudi class, as ``from_pretrained`` would give."""
    torch.manual_seed(0)
    if kind == "gpt2":
        return gpt2.GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if kind == "qwen2_moe":  # a mixture of experts: Optimum's layer calls torch.ops.hpu.mixture_of_experts
        return qwen2_moe.Qwen2MoeForCausalLM(Qwen2MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64))
    return llama.LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=64))


def dataset(length: int = 16) -> list[dict]:
    """Causal-LM examples: the corpus tokenized into rows of ``length`` tokens."""
    ids = [i for line in CORPUS for i in tokenizer()(line)["input_ids"]]
    rows = [torch.tensor(ids[i:i + length]) for i in range(0, len(ids) - length + 1, length)]
    return [{"input_ids": row, "labels": row} for row in rows]


PROMPTS = ["a gaudi card runs the graph", "deep speed shards the optimizer state"]  # 6 tokens each


def gaudi_greedy(model: torch.nn.Module, device: str, **options) -> list:
    """Optimum's Gaudi ``generate()`` as its run_generation.py calls it: 8 greedy tokens after ``PROMPTS``, with
    the KV cache, static shapes and ``use_flash_attention`` (FusedSDPA); ``options`` go to ``generate()``
    (``lazy_mode``, ``hpu_graphs``). The tokens, on the host."""
    tok = tokenizer()
    prompts = tok(PROMPTS, return_tensors="pt")
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens, config.do_sample, config.pad_token_id = 8, False, tok.pad_token_id
    config.use_cache, config.static_shapes, config.bucket_size, config.ignore_eos = True, True, -1, True
    config.use_flash_attention, config.flash_attention_recompute = True, False
    with torch.no_grad():
        out = model.generate(input_ids=prompts["input_ids"].to(device),
                             attention_mask=prompts["attention_mask"].to(device), generation_config=config,
                             **options)
    return out.cpu().tolist()
