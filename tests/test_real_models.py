"""A representative subset of bench/real_models.py in strict mode, compared with eager: tiny transformers
models (random weights) and small vision models, for inference, one training step (loss and every
gradient) and dynamic shapes at two sequence lengths. Strict mode raises on any CPU fallback of an ATen
op and on any graph that would run eagerly, so a pass means the whole model ran from recipes.

``python bench/real_models.py`` runs every architecture and cell, with aot_eager and the default mode
side by side (README, "Real models").
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)

pytest.importorskip("transformers")


def _bench():
    spec = importlib.util.spec_from_file_location("hpu_bench_real_models", ROOT / "bench" / "real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rm = _bench()

SUBSET = [
    ("gpt2", "training"),
    ("llama", "dynamic"),  # float maths on symbolic sizes, on the host
    ("wav2vec2", "training"),  # weight norm's backward
    ("levit", "training"),  # indexing with None in the index list
    ("mixtral", "inference"),  # transformers' MoE custom op (a known CPU fallback)
    ("resnet", "training"), ("vit", "inference"), ("mobilenetish", "training"),
]


# Config changes that keep the suite within its time budget (the benchmark runs the models as listed).
QUICKER = {"llama": {"num_hidden_layers": 1}}


@pytest.mark.parametrize("model, cell", SUBSET, ids=[f"{m}-{c}" for m, c in SUBSET])
def test_real_model_matches_eager_in_strict_mode(model, cell):
    spec = rm.BY_NAME[model]
    if model in QUICKER:
        spec = dataclasses.replace(spec, build=functools.partial(spec.build, **QUICKER[model]))
    rm.RUNNERS[cell](spec, "hpu_backend strict")  # each runner asserts closeness to eager
