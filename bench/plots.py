"""Redraw the README's plots from the committed results (bench/results/*.json), without running anything:
    python bench/plots.py      (needs matplotlib: pip install '.[bench]')
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import capacity_bench  # noqa: E402
import fabric_bench  # noqa: E402
import first_call_bench  # noqa: E402
import latency_bench  # noqa: E402
from common import RESULTS  # noqa: E402


def main() -> None:
    first_call_bench.plot(_read("first_call_bench"))
    latency_bench.plot(_read("latency_bench"))
    capacity_bench.plot(_read("capacity_bench")["rows"], "capacity_bench")
    fabric_bench.plot(_read("fabric_bench")["rows"])
    print("wrote", ", ".join(str(p.relative_to(RESULTS.parent.parent)) for p in sorted(RESULTS.glob("*.png"))))


def _read(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


if __name__ == "__main__":
    main()
