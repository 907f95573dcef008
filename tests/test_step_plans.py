"""Plans of a whole training step for every model file (item 9 of the second new-user pass): the largest training
batch counts gradients, optimizer state and master weights, whatever the file defines; the training plan takes a
model file without PER_CARD on one card."""

from __future__ import annotations

import pytest

from hpu_backend.diagnosis import analyze
from hpu_backend.planning.capacity import CapacityError
from hpu_backend.diagnosis.step_memory import StepState, optimizer_of, step_state
from hpu_backend.planning.training_plan import plan_training
from hpu_backend.shipping.warm import plan

from cli_helpers import TINY, tiny_model

WIDE = TINY.replace("Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)",
                    "Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)")


def _spec(tmp_path, text=WIDE, name="wide"):
    from hpu_backend import load_model_file

    return load_model_file(tiny_model(tmp_path, name, text))


@pytest.mark.parametrize("source, expected", [
    ("opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)", ("SGD", 1)),
    ("opt = torch.optim.SGD(params, lr=0.1)", ("SGD", 0)),
    ("from torch.optim import AdamW\nopt = AdamW(params)", ("AdamW", 2)),
    ("pass", ("", 2)),  # none named: AdamW's states are planned
])
def test_the_optimizer_is_read_from_the_source_and_adamw_is_assumed_when_none_is_named(tmp_path, source, expected):
    spec = _spec(tmp_path, WIDE + "\ndef train(params):\n    " + source.replace("\n", "\n    ") + "\n")
    assert optimizer_of(spec) == expected


def test_the_step_state_counts_every_trainable_parameter(tmp_path):
    spec = _spec(tmp_path, WIDE + "\ndef train(p):\n    torch.optim.SGD(p, momentum=0.9)\n")
    n = sum(p.numel() for p in spec.build_model().parameters())
    state = step_state(spec)
    assert (state.parameters, state.gradients, state.optimizer_state, state.master_weights) == (4 * n, 4 * n, 4 * n, 0)
    # the peak: state held all step + the largest of forward, backward with the parameters, the optimizer step
    assert state.peak([("forward", 10**6), ("backward", 10)]) == 4 * n + 10**6
    assert state.peak([("forward", 10), ("backward", 10**6)]) == 4 * n + 10**6 + 4 * n
    assert state.peak([("forward", 1), ("backward", 1)]) == 4 * n + 8 * n
    half = StepState("AdamW", 2 * n, 2 * n, 8 * n, 4 * n)  # bf16 parameters: an fp32 master copy
    assert half.held() == 12 * n


def test_the_largest_training_batch_leaves_room_for_the_whole_step(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    points = plan(spec, train=True)
    hbm = analyze.hbm_bytes("gaudi2")
    whole = analyze._max_batch(spec, points, hbm, True, "gaudi2")
    monkeypatch.setattr(analyze, "step_state", lambda spec: StepState("none", 0, 0, 0, 0))
    graphs_only = analyze._max_batch(spec, points, hbm, True, "gaudi2")
    assert whole["step"]["optimizer_state"] == 2 * whole["step"]["parameters"] > 0
    assert (whole["step"]["optimizer"], whole["step"]["assumed"]) == ("AdamW", True)
    assert 0 < whole["batch"] < graphs_only["batch"]
    assert whole["peak_bytes"] <= hbm


def test_a_training_plan_without_per_card_plans_the_file_on_one_card(tmp_path):
    spec = _spec(tmp_path)
    doc = plan_training(spec, "gaudi2", "bf16", seq=1, global_batch=64)
    n = sum(p.numel() for p in spec.build_model().parameters())
    assert doc["memory"]["optimizer_state_bytes"] == 8 * n and doc["fits_hbm"] and doc["max_batch"]["batch"] > 64
    with pytest.raises(CapacityError, match="tensor parallel over 2 cards needs PER_CARD"):
        plan_training(spec, "gaudi2", "bf16", seq=1, global_batch=64, cards=2, tp=2)


def test_analyze_prints_the_whole_step_and_a_library_recompile_as_such(capsys):
    from hpurecipe.analysis import print_analysis

    doc = {"model": "m", "mode": "train", "target": "gaudi2", "hbm_bytes": 2**30, "buckets": [],
           "graph_break_reasons": [], "recompiles": [
               {"function": "wrapper (generic.py:1030)", "cause": "input shape", "variable": "args[0]",
                "change": "dim 0: 1 -> 2", "source": "generic.py:1036", "guard": "g",
                "library": "transformers/utils/generic.py"}],
           "max_batch": {"batch": 8, "at": {}, "peak_bytes": 2**29, "step": StepState(
               "AdamW", 2**20, 2**20, 2**21, 0, assumed=True).to_dict()}}
    print_analysis(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "at generic.py:1036 (in library code: transformers/utils/generic.py)" in out
    assert ("The whole step: parameters 1.0 MiB, gradients 1.0 MiB, optimizer state 2.0 MiB (AdamW, assumed: the "
            "model file names no optimizer), master weights 0 B.") in out
