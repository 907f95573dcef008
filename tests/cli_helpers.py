"""Helpers shared by the CLI and warm-up tests: a tiny model file and a CliRunner wrapper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from hpurecipe.main import app

TINY = '''
import torch

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

def make_inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g)

def loss(output, x, labels):
    return torch.nn.functional.cross_entropy(output, labels)

MODEL_INPUTS = 1
AXES = {"batch": [2, 8]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:2"}}
'''


# Pieces of model files for tests of their errors.
LINEAR = "def make_model():\n    return torch.nn.Linear(4, 4)\n"
INPUTS = "def make_inputs(batch, seed=0):\n    return (torch.randn(batch, 4),)\n"


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def tiny_model(directory: Path, name: str = "tiny", text: str = TINY) -> Path:
    path = Path(directory) / f"{name}.py"
    path.write_text(text)
    return path


def cli(*args, input: str | None = None, code: int | None = 0):
    """Run hpurecipe in-process; check the exit code (unless ``code`` is None); return the result."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    assert code is None or result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


def cli_json(*args, code: int = 0):
    return json.loads(cli(*args, "--json", code=code).stdout)


def cli_process(*args) -> dict:
    """Run ``hpurecipe ... --json`` in a fresh process (as a deployment would) and return its JSON output."""
    proc = subprocess.run([sys.executable, "-m", "hpurecipe.main", *map(str, args), "--json"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parent.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
