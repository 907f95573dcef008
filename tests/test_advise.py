"""hpurecipe advise: the Gaudi checklist over a model file, each problem once with its source line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import TINY, cli, one_line, tiny_model

ROOT = Path(__file__).resolve().parents[1]
POOR = ROOT / "models" / "poor_habits.py"


def _line(pattern: str) -> int:
    """The line of models/poor_habits.py holding ``pattern`` (found, not hard-coded)."""
    (n,) = [i for i, text in enumerate(POOR.read_text().splitlines(), 1) if pattern in text]
    return n


@pytest.fixture(scope="module")
def report():
    return json.loads(cli("advise", str(POOR), "--train", "--json").stdout)


@pytest.mark.e2e
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


@pytest.mark.e2e
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


def test_a_compile_only_run_hands_the_model_zeros_not_the_allocators_leftovers():
    """What advise runs is compile-only: a forward that reads an output on the host (``.item()``) must see the
    same values in every process, never bytes a freed tensor left behind (they made advise report recompiles
    on constants like 1.17e+26)."""
    import torch

    compiled = torch.compile(lambda x: (x * 2).sum(-1), backend="hpu_backend",
                             options={"cache": False, "execute": False})
    x = torch.randn(16, 64)
    for _ in range(3):
        torch.full((16,), 1.17e26)  # freed at once: the chunk the next tensor of this size is likely to get
        out = compiled(x)
        assert out.shape == (16,) and out.abs().max().item() == 0


@pytest.mark.e2e
def test_advise_gives_the_same_findings_in_two_fresh_processes(report):
    """The user's runs: `hpurecipe advise models/poor_habits.py --train` in new processes finds what this one
    found, every time."""
    command = [sys.executable, "-c", "import sys; from hpurecipe.main import app; app(sys.argv[1:])",
               "advise", str(POOR), "--train", "--json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli")]))
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    outputs = [run.communicate(timeout=400) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs[0][1][-2000:]
    first, second = ([(f["check"], f["where"]) for f in json.loads(stdout)["findings"]] for stdout, _ in outputs)
    assert first == second  # the same findings in the same order (gains and host times may vary)
    # This process compiled other graphs before (other tests): graph names differ by their number only.
    numbered = re.compile(r"\b(fx_graph|lazy_graph)_\d+")
    want = sorted((c, numbered.sub(r"\1_N", w)) for c, w in ((f["check"], f["where"]) for f in report["findings"]))
    assert sorted((c, numbered.sub(r"\1_N", w)) for c, w in first) == want


def test_a_train_run_gets_the_hpu_graphs_advice_for_training(report):
    """The user's `--train` run was told HPU Graphs serve "inference": a training step's capture is another API."""
    graphs = next(f for f in report["findings"] if f["check"] == "hpu graphs")
    text = " ".join((graphs["what"], graphs["why"], graphs["fix"]))
    assert report["mode"] == "train" and "training" in graphs["why"] and "make_graphed_callables" in graphs["fix"]
    assert "inference model" not in text and "wrap_in_hpu_graph" not in graphs["fix"]


GAUDI_SCRIPT = """
import sys, torch
import habana_frameworks.torch.core as htcore

open(sys.argv[1], "w").write("ran")  # a script's top level runs when it is imported
model = torch.nn.Linear(8, 4).to("hpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(2, 8).to("hpu")).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    htcore.mark_step()
print("loss", loss.item())
"""


@pytest.mark.e2e
def test_a_gaudi_script_is_refused_in_one_line_naming_what_reads_it_and_that_works(tmp_path):
    """A user gave advise and analyze their Gaudi training script: one line, nothing run, and its advice works."""
    path, marker, trace = tmp_path / "train.py", tmp_path / "ran.txt", tmp_path / "t.json"
    path.write_text(GAUDI_SCRIPT)
    for command in ("advise", "analyze"):
        line = one_line(cli(command, path, code=1))
        assert "a script, not a model file" in line and "imports habana_frameworks" in line, line
        assert f"hpurecipe run --trace t.json {path} ARGS" in line and "hpurecipe perf-tool --trace t.json" in line
        assert "No module named" not in line
    assert not marker.exists()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli")]))
    run = subprocess.run([sys.executable, "-m", "hpurecipe.main", "run", "--trace", str(trace), str(path), str(marker)],
                         capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    assert run.returncode == 0 and marker.read_text() == "ran", run.stderr[-3000:]
    assert "host syncs: 1" in run.stderr and f"{path.name}:" in run.stderr
    assert "limiting resource:" in cli("perf-tool", "--trace", trace).output
