"""hpurecipe advise: the Gaudi checklist over a model file, each problem once with its source line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import TINY, cli, tiny_model

ROOT = Path(__file__).resolve().parents[1]
POOR = ROOT / "models" / "poor_habits.py"


def _line(pattern: str) -> int:
    """The line of models/poor_habits.py holding ``pattern`` (found, not hard-coded)."""
    (n,) = [i for i, text in enumerate(POOR.read_text().splitlines(), 1) if pattern in text]
    return n


@pytest.fixture(scope="module")
def report():
    return json.loads(cli("advise", str(POOR), "--train", "--json").stdout)


def test_each_poor_habit_is_found_once_with_its_line(report):
    found = {(f["check"], f["where"]) for f in report["findings"]}
    want = {("cpu fallback", f"poor_habits.py:{_line('torch.special.bessel_j0(')}"),
            ("hand-written attention", f"poor_habits.py:{_line('scores.softmax(-1) @ v')}"),
            ("host sync", f"poor_habits.py:{_line('.item() > 1e4')}"),
            ("recompile", f"poor_habits.py:{_line('STEP_SCALES[self.step')}"),
            ("unfused optimizer", f"poor_habits.py:{_line('= torch.optim.AdamW(')}"),
            ("gradient clipping", f"poor_habits.py:{_line('torch.nn.utils.clip_grad_norm_(model')}"),
            ("autocast", "poor_habits.py:%d" % _line('with torch.autocast(device_type="hpu"'))}
    assert want <= found
    checks = [f["check"] for f in report["findings"]]
    for check in ("cpu fallback", "hand-written attention", "host sync", "unfused optimizer", "gradient clipping"):
        assert checks.count(check) == 1, check


def test_findings_explain_why_and_the_fix_and_lead_with_the_estimated_gains(report):
    findings = report["findings"]
    loop = next(f for f in findings if "loop constant" in f["what"])
    assert "self.step" in loop["what"] and "torch.tensor(steps)" in loop["fix"]
    attention = next(f for f in findings if f["check"] == "hand-written attention")
    assert attention["gain_s"] > 0 and "scaled_dot_product_attention" in attention["fix"]
    fallback = next(f for f in findings if f["check"] == "cpu fallback")
    assert fallback["gain_s"] > 0 and "special_bessel_j0" in fallback["what"]
    gains = [f["gain_s"] for f in findings if f["gain_s"]]
    assert gains == sorted(gains, reverse=True)
    first_none = next(i for i, f in enumerate(findings) if not f["gain_s"])
    assert all(not f["gain_s"] for f in findings[first_none:])
    assert all(f["why"] for f in findings) and report["estimate"] is True


def test_a_plain_model_renders_a_table_and_the_file_is_read_not_run(tmp_path):
    """The training loop in a model file is read for its optimizer, never run (it would print)."""
    model = tiny_model(tmp_path, text=TINY + TRAIN_LOOP)
    out = cli("advise", model, "--train")
    assert "step 0" not in out.stdout and "unfused optimizer" in out.stdout and "tiny.py:" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


TRAIN_LOOP = """
def train():
    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    print("step 0")
"""


def test_advise_options_are_checked():
    assert "expected gaudi2 or gaudi3" in cli("advise", str(POOR), "--target", "tpu", code=2).stderr
