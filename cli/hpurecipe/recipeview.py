"""One recipe as plain sections for ``hpurecipe show``: header, inputs/outputs, placement, guards and every fact."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from hpu_backend.formats import symexpr
from hpu_backend.formats.program import Program
from hpu_backend.formats.recipe import Recipe, ValueSpec
from recipecache import Entry

from . import render


def _spec(name: str, spec: ValueSpec, labels: dict[str, str]) -> dict[str, Any]:
    """A value's row: named as the user's code names it where the recipe knows (``fc1.weight`` for AOTAutograd's
    ``primals_3``; ``graph_name`` keeps the graph's), on the device the recipe runs on (``traced_on``: where its
    example tensors were when it was traced, the host for the simulated device)."""
    shape = [symexpr.to_str(d) for d in spec.shape] if spec.kind == "tensor" else None
    return {"name": labels.get(name, name), "graph_name": name, "kind": spec.kind, "dtype": spec.dtype,
            "shape": shape, "device": "hpu" if spec.kind == "tensor" else "", "traced_on": spec.device}


def _labels(recipe: Recipe) -> dict[str, str]:
    labels = recipe.facts.get("input_labels") if isinstance(recipe.facts, dict) else None
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(labels, dict) else {}


def _outputs(recipe: Recipe) -> list[dict[str, Any]]:
    specs = dict(zip(recipe.input_names, ([s] for s in recipe.inputs)))
    specs.update({n.name: n.out for n in recipe.nodes})
    rows = []
    for i, out in enumerate(recipe.outputs):
        if isinstance(out, dict) and "r" in out and specs.get(out["r"]):
            rows.append(_spec(out["r"], specs[out["r"]][0], _labels(recipe)))
        else:
            rows.append({"name": f"output {i}", "kind": "constant", "dtype": "", "shape": None, "device": "",
                         "value": out})
    return rows


def _placement(recipe: Recipe) -> dict[str, Any]:
    # The op each fallback ran, as placement recorded it (a with_effects wrapper's is the op it wraps).
    placement = recipe.facts.get("placement") if isinstance(recipe.facts, dict) else None
    recorded = placement.get("fallbacks") if isinstance(placement, dict) else None
    ran = {f["node"]: f["op"] for f in (recorded if isinstance(recorded, list) else [])
           if isinstance(f, dict) and isinstance(f.get("node"), str) and isinstance(f.get("op"), str)}
    return {"nodes": len(recipe.nodes),
            "by_placement": dict(Counter(n.placement for n in recipe.nodes)),
            "by_engine": dict(Counter(n.engine or "-" for n in recipe.nodes)),
            "clusters": dict(sorted(Counter(n.cluster for n in recipe.nodes if n.cluster >= 0).items())),
            "fused_nodes": sum(1 for n in recipe.nodes if n.fusion >= 0),
            "fallbacks": [{"node": n.name, "op": ran.get(n.name, n.op), "source": n.source}
                          for n in recipe.nodes if n.placement == "cpu"]}


def describe(entry: Entry, recipe: Recipe | Program, size: int) -> dict[str, Any]:
    """Everything ``show`` prints, as JSON-ready data (facts are passed through as the recipe has them)."""
    if isinstance(recipe, Program):
        return _describe_program(entry, recipe, size)
    meta = entry.meta
    return {
        "key": entry.key, "graph": recipe.name, "kind": recipe.kind, "model": meta.get("model", ""),
        "target": recipe.target, "bucket": recipe.bucket, "size": size, "created": entry.created,
        "compile_time_s": meta.get("compile_time_s"), "toolchain": meta.get("key_detail", {}).get("toolchain"),
        "settings": meta.get("key_detail", {}).get("settings"),
        "inputs": [_spec(n, s, _labels(recipe)) for n, s in zip(recipe.input_names, recipe.inputs)],
        "outputs": _outputs(recipe), "symbols": recipe.symbols,
        "guards": [symexpr.to_str(g) for g in recipe.guards],
        "placement": _placement(recipe), "facts": recipe.facts,
    }


def _describe_program(entry: Entry, program: Program, size: int) -> dict[str, Any]:
    """A program: the AOTAutograd graphs of one Dynamo graph, its guards and runtime contract."""
    return {
        "key": entry.key, "graph": entry.meta.get("graph", ""), "kind": "program", "mode": program.mode,
        "model": entry.meta.get("model", ""), "size": size, "created": entry.created,
        "symbols": program.symbols, "guards": [symexpr.to_str(g) for g in program.guards],
        "graphs": [{"graph": g.template.name, "kind": g.template.kind, "nodes": len(g.template.nodes),
                    "inputs": len(g.template.inputs), "outputs": len(g.template.outputs)} for g in program.graphs],
        "contract": dataclasses.asdict(program.contract), "specialize": program.specialize,
    }


def print_description(doc: dict[str, Any]) -> None:
    if doc["kind"] == "program":
        return _print_program(doc)
    render.pairs({"key": doc["key"], "graph": f"{doc['graph']} ({doc['kind']})", "model": doc["model"] or "-",
                  "target": doc["target"], "bucket": render.bucket(doc["bucket"]), "size": render.size(doc["size"]),
                  "created": render.ago(doc["created"]),
                  "compile time": render.duration(doc["compile_time_s"] or 0.0),
                  "toolchain": _inline(doc["toolchain"]), "settings": _inline(doc["settings"])})
    for title in ("inputs", "outputs"):
        render.table(["name", "kind", "dtype", "shape", "device"],
                     ([r["name"], r["kind"], r["dtype"], _shape(r["shape"]), r["device"]] for r in doc[title]),
                     title=f"\n{title} ({len(doc[title])})")
    _print_placement(doc["placement"])
    render.note("\n[bold]guards[/bold]: {}", "; ".join(doc["guards"]) or "none")
    for name, value in doc["facts"].items():
        if name != "input_labels":  # shown as the inputs' names
            _print_fact(name, value)


def _print_program(doc: dict[str, Any]) -> None:
    render.pairs({"key": doc["key"], "graph": f"{doc['graph']} (program, {doc['mode']})",
                  "model": doc["model"] or "-", "size": render.size(doc["size"]),
                  "created": render.ago(doc["created"]), "symbols": ", ".join(doc["symbols"]) or "none",
                  "guards": "; ".join(doc["guards"]) or "none"})
    render.table(["graph", "kind", "nodes", "inputs", "outputs"],
                 ([g["graph"], g["kind"], g["nodes"], g["inputs"], g["outputs"]] for g in doc["graphs"]),
                 title=f"\ngraphs ({len(doc['graphs'])})")
    _print_fact("contract", doc["contract"])


def _print_placement(p: dict[str, Any]) -> None:
    render.pairs({"nodes": p["nodes"], "placement": _inline(p["by_placement"]), "engines": _inline(p["by_engine"]),
                  "clusters": _inline(p["clusters"]) or "none", "fused nodes": p["fused_nodes"],
                  "fallbacks": len(p["fallbacks"])}, title="\nnodes")
    if p["fallbacks"]:
        render.table(["node", "op", "source"], ([f["node"], f["op"], f["source"]] for f in p["fallbacks"]),
                     title="CPU fallbacks")


def _print_fact(name: str, value: Any) -> None:
    """A fact, whatever its shape: a scalar, a flat map, a list of records, or nested data."""
    if isinstance(value, dict) and value:
        flat = {k: v for k, v in value.items() if not isinstance(v, (dict, list)) or _short(v)}
        render.pairs({k: _fmt(k, v) for k, v in flat.items()}, title=f"\n{name}")
        for k, v in value.items():
            if k not in flat:
                _print_fact(f"{name}.{k}", v)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        columns = list(dict.fromkeys(k for v in value for k in v))
        render.table(columns, ([_fmt(c, v.get(c)) for c in columns] for v in value),
                     title=f"\n{name} ({len(value)})")
    else:
        render.note("\n[bold]{}[/bold]: {}", name, _fmt(name, value))


def _short(v: Any) -> bool:
    return len(_inline(v)) <= 60


def _fmt(name: str, v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, float)) and name.endswith("bytes"):
        return render.size(v)
    if isinstance(v, float) and (name.endswith("_s") or name.endswith("time")):
        return render.duration(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and len(v) > 8:
        return f"{len(v)} items (all with --json)"
    return _inline(v) if isinstance(v, (dict, list)) else str(v)


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_inline(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    return "" if v is None else str(v)


def _shape(shape: list | None) -> str:
    return "" if shape is None else "[" + ", ".join(shape) + "]"
