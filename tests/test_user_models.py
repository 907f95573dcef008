"""Advice that is right on models as new users write them (tests/user_models/, kept as written): a VGG-style CNN
with batch norm, a denoiser with a loop-carried constant, DistilBERT from transformers. No hand-written-attention
finding where the code calls SDPA; the real recompile cause, at the user's own line; library code named as such;
the batch-size finding planned over the whole training step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hpu_backend import load_model_file
from hpu_backend.diagnosis.advise import advise

USER_MODELS = Path(__file__).resolve().parent / "user_models"


def _line(name: str, pattern: str) -> str:
    """"name.py:N" for the one line of a user model holding ``pattern`` (found, not hard-coded)."""
    (n,) = [i for i, text in enumerate((USER_MODELS / name).read_text().splitlines(), 1) if pattern in text]
    return f"{name}:{n}"


def _findings(doc: dict, check: str) -> list[dict]:
    return [f for f in doc["findings"] if f["check"] == check]


@pytest.fixture(scope="module")
def distilbert():
    pytest.importorskip("transformers")
    return advise(load_model_file(USER_MODELS / "distilbert.py"), train=True)


@pytest.fixture(scope="module")
def vgg():
    return advise(load_model_file(USER_MODELS / "vgg_bn.py"))


@pytest.mark.e2e
def test_distilbert_in_training_calls_sdpa_so_no_hand_written_attention_is_reported(distilbert):
    """transformers calls F.scaled_dot_product_attention; dropout in training makes torch decompose it on the
    host. Gaudi runs the call as FusedSDPA: there is nothing to rewrite."""
    assert _findings(distilbert, "hand-written attention") == []
    assert distilbert["findings"], "the advisor ran and found the rest"


@pytest.mark.e2e
def test_distilbert_recompile_is_dynamo_specializing_batch_1_named_at_the_users_axes(distilbert):
    (rec,) = _findings(distilbert, "recompile")
    assert "Dynamo specializes sizes 0 and 1" in rec["what"] and "batch=1" in rec["what"]
    assert rec["where"] == _line("distilbert.py", "AXES = {")  # the user's own line, not transformers'
    assert rec["library"].startswith("transformers/") and "in library code: transformers/" in rec["what"]
    assert "mark the dimension dynamic" not in rec["fix"] and "AXES['batch']" in rec["fix"]


@pytest.mark.e2e
def test_distilbert_batch_size_plans_the_whole_training_step(distilbert):
    (batch,) = _findings(distilbert, "batch size")
    assert "the whole step planned" in batch["what"] and "AdamW state (assumed" in batch["what"]


@pytest.mark.e2e
def test_vgg_recompiles_are_the_batch_1_graph_and_the_convolution_size_range(vgg):
    recompiles = {re.search(r"\((x dim 0: [^)]+)\)", f["what"])[1]: f for f in _findings(vgg, "recompile")}
    assert set(recompiles) == {"x dim 0: 1 -> 4", "x dim 0: 2..15 -> 16"}, recompiles
    one = recompiles["x dim 0: 1 -> 4"]
    assert "Dynamo specializes sizes 0 and 1" in one["what"] and one["where"] == _line("vgg_bn.py", "AXES = {")
    size_range = recompiles["x dim 0: 2..15 -> 16"]
    assert "size-range guard" in size_range["what"] and "warm a point in each range" in size_range["fix"]
    assert size_range["where"] == _line("vgg_bn.py", "return self.head(self.features(x))")
    assert all(f["library"] == "" for f in vgg["findings"])  # the user's own code throughout


def test_denoiser_loop_constant_is_named_at_the_users_line():
    doc = advise(load_model_file(USER_MODELS / "denoiser.py"))
    (rec,) = _findings(doc, "recompile")
    assert "loop constant pattern" in rec["what"] and "self.step" in rec["what"]
    assert rec["where"] == _line("denoiser.py", "sigma = SIGMAS[")
    assert "torch.tensor(steps)" in rec["fix"]


def test_library_code_is_told_from_the_users_own_files():
    from hpu_backend.serve.sources import library_location

    assert library_location("torch/nn/modules/conv.py:560") == "torch/nn/modules/conv.py:560"  # as recipes store it
    assert library_location(f"{torch.__file__}:1") == "torch/__init__.py:1"  # as Dynamo's frames give it
    assert library_location(f"{USER_MODELS / 'vgg_bn.py'}:3") == ""
    assert library_location("tests/user_models/vgg_bn.py:3") == "" and library_location("fx_graph_0001_fw") == ""
