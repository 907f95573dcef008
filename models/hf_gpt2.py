"""A model file: Hugging Face GPT-2 with a tiny configuration (random weights, built from its config: no download).

The forward returns the logits only (``use_cache=False``). Used by bench/first_call_bench.py
(``--models hf_gpt2 --modes infer``) for the precompiled start-up row; needs ``transformers``.
"""
import torch
VOCAB = 96
class TinyGPT2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        self.lm = GPT2LMHeadModel(config).eval()
    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits
def make_model():
    return TinyGPT2()
def make_inputs(batch, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (batch, seq), generator=g),)
MODEL_INPUTS = 1
AXES = {"batch": [2], "seq": [16, 32, 64]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:16"}}
