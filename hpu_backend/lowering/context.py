"""What every pass may read besides the graph: settings, names, the graph's guards and bucket.

One context is made per lowering and never changed: a graph's lowering gets one holding its FX graph,
and each bucket's lowering gets its own from ``for_bucket`` (the bucket set, the FX graph dropped).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..settings import Settings


@dataclass(frozen=True)
class LoweringContext:
    settings: Settings
    name: str = "fx_graph"  # e.g. "fx_graph_0003_fw"
    kind: str = "inference"  # "forward" | "backward" | "inference" | "lazy"
    guards: tuple[Any, ...] = ()  # sympy boolean expressions from the ShapeEnv
    bucket: Mapping[str, list[int]] = field(default_factory=dict)  # symbol -> [lo, hi] for bucket passes
    gm: Any = None  # the aten torch.fx.GraphModule of a graph's lowering (None for a bucket's, or from disk)
    # Process-group name -> size, for collectives lowered outside a running job (capacity planning); in a
    # job, groups resolve among the process's own.
    groups: Mapping[str, int] = field(default_factory=dict)
    # What the user calls each input of the Dynamo graph (``conv1.weight``, ``x``), by flat index; AOTAutograd's
    # inputs point back to them (``node.meta["desc"]``), so ``show`` names primals as the model does.
    input_labels: tuple[str, ...] = ()

    def for_bucket(self, bucket: Mapping[str, list[int]]) -> "LoweringContext":
        """The context of one bucket's lowering: this graph's, with the bucket and without the FX graph."""
        return dataclasses.replace(self, bucket={s: list(b) for s, b in bucket.items()}, gm=None)

    def at(self, values: Mapping[str, int]) -> "LoweringContext":
        """The context of a lowering at exact symbol values (a bucket of one size per symbol)."""
        return self.for_bucket({s: [v, v] for s, v in values.items()})
