"""Shared benchmark helpers: timing loops, model loading, JSON results, tables and optional plots."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BACKENDS = ("eager", "aot_eager", "inductor", "hpu_backend")


def load_model_file(name: str):
    path = ROOT / "models" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_models_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def per_call_us(fn: Callable[[], object], repeat: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of ``repeat`` calls, in microseconds."""
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        means.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(means)


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor()
            or platform.machine(), "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c != columns[0] else "left")
    for r in rows:
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r])
    Console(width=max(160, Console().width)).print(table)


def maybe_plot(name: str, labels: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """A grouped bar chart to bench/results/<name>.png when matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png")


def ratio_plot(name: str, rows: list[dict], labels: list[str], title: str, goal: float) -> str | None:
    """Estimate/published per row as bars (blue: a calibration row, fitted on; orange: validation), with the
    goal band, to bench/results/<name>.png; its path relative to the repository, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(rows)), 4.8))
    ax.bar(range(len(rows)), [r["ratio"] for r in rows],
           color=["tab:blue" if r["fitted_on"] else "tab:orange" for r in rows])
    ax.axhline(1.0, color="black", lw=1)
    for y in (1 - goal, 1 + goal):
        ax.axhline(y, color="grey", ls="--", lw=1)
    ax.set_xticks(range(len(rows)), labels, rotation=50, ha="right", fontsize=7)
    ax.set_ylabel("estimate / published")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    return str(path.relative_to(ROOT))


def run_worker(script: str, mode: str, steps: int, warmup: int) -> dict:
    """``script --worker MODE`` in a fresh process (one thread unless OMP_NUM_THREADS says otherwise, this checkout
    importable): the JSON it prints last."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, script, "--worker", mode, "--steps", str(steps), "--warmup", str(warmup)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
