"""DistilBERT sequence classification from transformers, from a tiny config made here (the advisor's test model;
kept as written). transformers calls F.scaled_dot_product_attention; with dropout in training torch decomposes it."""
import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification


def make_model():
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                              max_position_embeddings=32, num_labels=2, attn_implementation="sdpa")
    return DistilBertForSequenceClassification(config)


def make_inputs(batch, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (batch, seq), generator=g)
    return ids, torch.ones(batch, seq, dtype=torch.long), torch.randint(0, 2, (batch,), generator=g)


def loss(output, ids, mask, labels):
    return torch.nn.functional.cross_entropy(output.logits, labels)


MODEL_INPUTS = 2
AXES = {"batch": [1, 2, 3], "seq": [8]}
COMPILE = {"dynamic": True, "options": {}}
