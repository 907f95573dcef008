"""``hpurecipe perf-tool --trace FILE``: habana_perf_tool's guidance over a step-timeline trace (ours, or one in
the same layout), streamed; imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import render
from .errors import CliError
from .options import Json


def perf_tool(trace: Annotated[Path, typer.Option("--trace", help="A Chrome/Perfetto trace with /device:HPU rows "
                                                  "(hpurecipe run --trace writes one).", show_default=False)],
              json: Json = False) -> None:
    """Name the resource that limits the step (host, MME, TPC, DMA, network, syncs) with its share, then the
    advice with the step time each remedy would save: fewer syncs, HPU Graphs, more loader workers, pinned
    memory, a larger batch, MME/TPC usage. Every number is an estimate from the trace."""
    from hpu_backend.timeline.guidance import report
    from hpu_backend.timeline.trace import TraceError

    try:
        doc = report(str(trace))
    except TraceError as e:
        raise CliError(str(e)) from None
    render.emit_json(doc) if json else _print(doc)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _print(doc: dict) -> None:
    def line(text: str) -> None:
        render.console.print(text, soft_wrap=True, markup=False)  # one line per item, never folded

    step = doc["step_s"]
    compiles = f"; compiles left out: {_ms(doc['compile_s'])} per step" if doc.get("compile_s") else ""
    line(f"{render.clean(doc['trace'])}: {doc['steps']} steps, {_ms(step)} per step (estimate{compiles})")
    line(f"limiting resource: {doc['limiting']} ({doc['share']:.0%} of the step)")
    parts = [("host", doc["host_s"]), *doc["engines"].items(), ("syncs", doc["sync_s"])]
    line("busy per step: " + ", ".join(f"{k} {_ms(v)}" for k, v in parts))
    if not doc["advice"]:
        line("advice: none (no remedy shortens this step)")
    for i, a in enumerate(doc["advice"], 1):
        gain = "-" if a["gain_s"] is None else f"{_ms(a['gain_s'])} ({a['gain_s'] / step:.0%})" if step else "-"
        line(f"{i}. {a['what']}: saves {gain} per step — {render.clean(a['detail'])}")
