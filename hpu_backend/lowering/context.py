"""What every pass may read besides the graph: settings, names, the graph's guards and bucket."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..settings import Settings


@dataclass
class LoweringContext:
    settings: Settings
    name: str = "fx_graph"  # e.g. "fx_graph_0003_fw"
    kind: str = "inference"  # "forward" | "backward" | "inference"
    guards: list[Any] = field(default_factory=list)  # sympy boolean expressions from the ShapeEnv
    bucket: dict[str, list[int]] = field(default_factory=dict)  # symbol -> [lo, hi] for bucket passes
    gm: Any = None  # the aten torch.fx.GraphModule, while it is at hand (None for a recipe from disk)
