"""The end-of-run report (``hpu_backend/run/report.py``) as a new user reads it: bounded lines, eager mode's first
op layouts named by their op and not counted as recompiles, one "nothing compiled from step N on" that agrees with
the compiles, one line for a script with no device work, and one ``--report`` JSON shape for any number of ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpu_backend.run.report import render

ROOT = Path(__file__).resolve().parent.parent

CNN = """
    import torch, torch.nn as nn
    import habana_frameworks.torch.core as htcore
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).to("hpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(2, 3, 8, 8).to("hpu")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        htcore.mark_step()
    print("loss", round(loss.item(), 3))
"""

NOTHING = """
    import sys
    sys.exit("usage: train.py --data DIR")  # exits before any device work
"""


def _launch(tmp: Path, name: str, text: str, *options: str, **extra: str) -> subprocess.CompletedProcess:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli")]), **extra)
    return subprocess.run([sys.executable, "-m", "hpu_backend.run", *options, str(path)], capture_output=True,
                          text=True, env=env, timeout=400, cwd=tmp)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The user's two runs, side by side: an eager CNN with --report, and a script that exits at once."""
    tmp = tmp_path_factory.mktemp("run_report")
    with ThreadPoolExecutor(2) as pool:
        cnn = pool.submit(_launch, tmp, "cnn", CNN, "--report", str(tmp / "cnn.json"), PT_HPU_LAZY_MODE="0")
        nothing = pool.submit(_launch, tmp, "nothing", NOTHING)
        return tmp, cnn.result(), nothing.result()


@pytest.mark.e2e
def test_one_process_writes_the_report_shape_of_n_ranks(runs):
    tmp, cnn, _ = runs
    assert cnn.returncode == 0, cnn.stderr[-3000:]
    doc = json.loads((tmp / "cnn.json").read_text())
    assert doc["world_size"] == 1 and len(doc["ranks"]) == 1
    (report,) = doc["ranks"]
    assert report["rank"] == 0 and report["mode"] == "eager" and report["exit_code"] == 0


@pytest.mark.e2e
def test_eager_first_op_layouts_are_named_by_op_and_are_not_recompiles(runs):
    tmp, cnn, _ = runs
    (report,) = json.loads((tmp / "cnn.json").read_text())["ranks"]
    layouts = report["op_layouts_compiled"]
    assert layouts["total"] == sum(layouts["ops"].values()) > 0
    assert any("convolution" in op for op in layouts["ops"]) and any("mm" in op for op in layouts["ops"])
    assert report["recompiles"] == []  # the same ops at new layouts are first compiles, not recompiles
    lines = render(report)
    text = "\n".join(lines)
    assert "recompiles: none" in text and "lazy_graph_" not in text and "eager op layouts: " in text
    op, count = next(iter(layouts["ops"].items()))  # the op with the most layouts
    shown = next(x for x in lines if "eager op layouts" in x)
    assert f"— {op.removeprefix('aten.').removesuffix('.default')} ×{count}" in shown
    assert "(nothing compiled from step 1 on)" in text  # steps 1-3 run ops already seen
    assert "— ?-bound" not in text and max(map(len, lines)) < 400


@pytest.mark.e2e
def test_a_script_with_no_device_work_gets_one_line(runs):
    _, _, nothing = runs
    assert nothing.returncode == 1, nothing.stderr[-3000:]
    lines = nothing.stderr.strip().splitlines()
    assert lines[0] == "usage: train.py --data DIR"
    assert len(lines) == 2 and lines[1].startswith("── hpu_backend: ") and lines[1].endswith("; no device work")
    assert "exited 1" in lines[1]


def _lazy(compiled: list[int], compile_steps: list[int], **more) -> dict:
    steps = [{"step": i, "graphs": 1, "recipes_compiled": n} for i, n in enumerate(compiled)]
    return {"script": "train.py", "exit_code": 0, "wall_s": 1.0, "mode": "lazy", "target": "gaudi2",
            "lazy_graph_steps": steps, "memory": {"peak_bytes": 1024, "hbm_bytes": 1 << 30},
            "timeline": {"compiles": {"total_s": 1.0, "steps": compile_steps}}, **more}


def test_nothing_compiled_from_step_n_agrees_with_every_compile():
    # The user's run: lazy graphs compiled in step 0 only, while torch.compile's graphs compiled in every step.
    steps = render(_lazy([3] + [0] * 59, list(range(60))))[1]
    assert "nothing compiled from" not in steps and "compiling up to step 59 of steps 0-59" in steps
    assert "lazy-graph recipes compiled per step: 3, 0, 0" in steps
    # A 21-step run that compiled in its steps 0-19 and ended on a quiet step 20 has no steady state to name.
    assert "compiling up to step 19 of steps 0-20" in render(_lazy([1] * 20 + [0], list(range(20))))[1]
    settled = render(_lazy([2, 1, 0, 0, 0], [0, 1]))[1]
    assert "(nothing compiled from step 2 on)" in settled


def test_the_recompiles_line_is_a_count_and_the_first_causes_cut_short():
    floats = [0.1 * i for i in range(300)]
    rec = [{"kind": "dynamo", "source": "train.py:12", "cause": "constant",
            "change": f"{floats} -> {[f + 1 for f in floats]}"},
           *({"kind": "lazy graph", "graph": f"lazy_graph_{i:04d}", "source": "train.py:30",
              "cause": f"like lazy_graph_0001 but constant {floats} changed to {floats[::-1]}"} for i in range(40))]
    line = next(x for x in render(_lazy([1, 0, 0], [0], recompiles=rec)) if "recompiles:" in x)
    assert line.strip().startswith("recompiles: 41 — train.py:12: constant ([0.0, 0.1")
    assert "… 38 more" in line and len(line) < 600 and str(floats[200]) not in line
