"""Shared benchmark helpers: timing loops, model loading, JSON results, tables and optional plots."""

from __future__ import annotations

import importlib.util
import json
import platform
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
