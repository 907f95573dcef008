"""Draw a trace's rows as a PNG (Perfetto's UI is not available offline here): one lane per host and device row,
a bar per span, over a window of steps. ``python bench/trace_plot.py TRACE.json OUT.png [--steps A:B]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hpu_backend.timeline.trace import events  # noqa: E402


def lanes(path: str) -> tuple[list[str], dict, list]:
    names, process, spans = {}, {}, []
    for e in events(path):
        if e.get("ph") == "M" and e["name"] == "process_name":
            process[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.append(e)
    order = sorted(names, key=lambda k: (k[0], k[1]))
    labels = [f"{process.get(p, p)} {names[(p, t)]}" for p, t in order]
    return labels, {k: i for i, k in enumerate(order)}, spans


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--steps", default="4:6", help="the steps to show, A:B (step spans on the host's Steps row)")
    ns = p.parse_args()
    labels, row, spans = lanes(ns.trace)
    first, last = (int(x) for x in ns.steps.split(":"))
    steps = [e for e in spans if e.get("cat") == "Steps"]
    begin = next(e["ts"] for e in steps if e["name"] == f"step {first}")
    end = next(e["ts"] + e["dur"] for e in steps if e["name"] == f"step {last}")
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(labels) + 1.2))
    colors = plt.get_cmap("tab10")
    for e in spans:
        start, stop = max(e["ts"], begin), min(e["ts"] + e["dur"], end)
        if stop < start:
            continue
        i = row[(e["pid"], e["tid"])]
        ax.broken_barh([((start - begin) / 1e3, max((stop - start) / 1e3, 1e-4))], (i - 0.4, 0.8),
                       color=colors(i % 10), edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms (estimate: host dispatch and device rows from the cost model; Python measured)")
    ax.set_title(f"{Path(ns.trace).name}: steps {first}-{last}")
    fig.tight_layout()
    fig.savefig(ns.out, dpi=90)


if __name__ == "__main__":
    main()
