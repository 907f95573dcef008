"""``analyze()``: what a model will do on an HPU — engines, fallbacks, clusters, fusions, estimated time and HBM.

It compiles the model with this backend on the example inputs, collects every recipe it takes up
(one per AOTAutograd graph and shape bucket) and reads the lowering's facts; graph breaks come
from ``torch._dynamo.explain``. The report is plain data (``to_dict()`` for JSON) and prints as a
rich table. Times and memory are estimates from the lowering's cost model and memory plan.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo

from ..serve.compiled import collect_recipes
from ..formats.recipe import Recipe
from ..units import size


@dataclass
class GraphReport:
    """One recipe: one AOTAutograd graph (forward, backward or inference) at one shape bucket."""

    name: str
    kind: str
    bucket: dict[str, list[int]]
    ops_by_engine: dict[str, int]
    fallbacks: list[dict[str, Any]]
    clusters: int
    fusions: dict[str, int]  # kind -> number of fused kernels
    host_transfers: dict[str, int]  # count, bytes (at the bucket's upper end)
    est_time_s: float
    est_device_s: float
    est_cpu_s: float
    est_transfer_s: float
    est_peak_bytes: int
    est_arena_bytes: int
    persistent_bytes: int
    on_chip_bytes: int
    fits_hbm: bool
    cache_hit: bool = False
    collectives: int = 0  # collective ops on the network engine
    est_comm_s: float = 0.0  # their estimated time not hidden behind compute

    @classmethod
    def from_recipe(cls, recipe: Recipe, hit: bool = False) -> "GraphReport":
        f = recipe.facts
        cost, mem, moves = f.get("cost", {}), f.get("memory", {}), f.get("host_transfers", {})
        return cls(
            name=recipe.name, kind=recipe.kind, bucket={s: list(b) for s, b in recipe.bucket.items()},
            ops_by_engine=dict(f.get("placement", {}).get("engines", {})),
            fallbacks=[{k: fb[k] for k in ("op", "dtypes", "reason") if k in fb}
                       for fb in f.get("placement", {}).get("fallbacks", [])],
            clusters=f.get("clusters", {}).get("count", 0),
            fusions=dict(Counter(x["kind"] for x in f.get("fusions", []))),
            host_transfers={"count": moves.get("count", 0), "bytes": moves.get("bytes", 0)},
            est_time_s=cost.get("total_s", 0.0), est_device_s=cost.get("device_s", 0.0),
            est_cpu_s=cost.get("cpu_s", 0.0), est_transfer_s=cost.get("transfer_s", 0.0),
            est_peak_bytes=mem.get("peak_bytes", 0), est_arena_bytes=mem.get("arena_bytes", 0),
            persistent_bytes=mem.get("persistent_bytes", 0), on_chip_bytes=mem.get("on_chip_bytes", 0),
            fits_hbm=mem.get("fits_hbm", True), cache_hit=hit, collectives=len(cost.get("collectives", [])),
            est_comm_s=cost.get("exposed_comm_s", 0.0))


@dataclass
class AnalysisReport:
    """Every graph of one model run, with Dynamo's graph breaks; all times and peaks are estimates."""

    target: str
    graphs: list[GraphReport]
    graph_breaks: int = 0
    break_reasons: list[str] = field(default_factory=list)

    @property
    def est_time_s(self) -> float:
        return sum(g.est_time_s for g in self.graphs)

    @property
    def est_peak_bytes(self) -> int:
        return max((g.est_peak_bytes for g in self.graphs), default=0)

    @property
    def fallback_ops(self) -> dict[str, int]:
        return dict(Counter(fb["op"] for g in self.graphs for fb in g.fallbacks))

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "estimate": True, "graph_breaks": self.graph_breaks,
                "break_reasons": list(self.break_reasons), "est_time_s": self.est_time_s,
                "est_peak_bytes": self.est_peak_bytes, "fallback_ops": self.fallback_ops,
                "graphs": [dataclasses.asdict(g) for g in self.graphs]}

    def table(self):
        """A rich Table, one row per graph."""
        from rich.table import Table

        t = Table(title=f"hpu_backend analysis for {self.target} (estimates; graph breaks: {self.graph_breaks})")
        for col in ("graph", "kind", "bucket", "ops by engine", "CPU fallbacks", "clusters", "fusions",
                    "est. time", "est. peak HBM", "host transfers"):
            t.add_column(col)
        for g in self.graphs:
            t.add_row(g.name, g.kind, _bucket(g.bucket), _counts(g.ops_by_engine),
                      ", ".join(sorted({fb["op"] for fb in g.fallbacks})) or "-", str(g.clusters),
                      _counts(g.fusions) or "-", _seconds(g.est_time_s), size(g.est_peak_bytes),
                      f"{g.host_transfers['count']} ({size(g.host_transfers['bytes'])})")
        return t

    def __rich__(self):
        return self.table()

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=160, record=True, file=_Null())
        console.print(self.table())
        return console.export_text()


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def analyze(model, *example_inputs, target: str = "gaudi2", options: dict | None = None,
            dynamic: bool | None = None, backward: bool = False) -> AnalysisReport:
    """Compile ``model`` for ``target`` on ``example_inputs`` and report what each graph does.

    ``backward=True`` also runs a backward pass (of the outputs' sum) to report training graphs.
    """
    explained = torch._dynamo.explain(model)(*example_inputs)
    torch._dynamo.reset()  # the explain run's frames must not hide our backend's compile
    compiled = torch.compile(model, backend="hpu_backend", dynamic=dynamic,
                             options={**(options or {}), "target": target})
    with collect_recipes() as found:
        with torch.set_grad_enabled(backward):
            out = compiled(*example_inputs)
        if backward:
            _sum(out).backward()
    return AnalysisReport(
        target=target, graphs=[GraphReport.from_recipe(r, hit) for _, r, hit in found],
        graph_breaks=explained.graph_break_count,
        break_reasons=[str(getattr(r, "reason", r)) for r in explained.break_reasons])


def _sum(out) -> torch.Tensor:
    tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    return sum(t.float().sum() for t in tensors)


def _counts(d: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(d.items()))


def _bucket(b: dict[str, list[int]]) -> str:
    return " ".join(f"{s}∈[{lo},{hi}]" for s, (lo, hi) in b.items()) or "static"


def _seconds(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"
