"""The advisor's timeline findings: per-step host reads, pageable copies on the critical path, and a host-bound
step HPU Graphs would shorten, each with the step time it saves on the step timeline (``hpu_backend/timeline``).

A model file is never run as a loop here, so its step is built from what is known: the bridge's dispatch of the
recipes of the compile-only run (one lazy graph per recipe, one op recorded per node), their device work, a
host→device copy of the inputs (pinned or not, blocking or not, as the file's source asks), and the host reads
found in the file's loops (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``; inside ``if i % N == 0`` once
every N steps). The user's own Python is not known without a run, so it is left out: a gain here is what the
bridge and the device alone would save. Each gain is the steady step on the timeline with and without the
change (``timeline/whatif.py``), never a threshold.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..timeline import whatif
from ..timeline.model import cost_of

STEPS = 20  # steps laid out: one read every N ≤ 20 steps shows at its rate
READS = ("item", "cpu", "tolist", "numpy")


def findings(spec, recipes: list, point: dict, target: str, make, train: bool = False) -> list:
    """``make(check, what, where, gain_s, fix)`` for each finding with a gain on the timeline (``train``: the
    step is a training step, and the fixes say so)."""
    tree, path = _source(spec)
    if tree is None or not recipes:
        return []
    reads = loop_reads(tree)
    pinned, non_blocking = _says(tree, "pin_memory"), _says(tree, "non_blocking")
    events = step_events(recipes, _input_bytes(spec, point), pinned, non_blocking, reads, f"{path.name}")
    out = []
    for line, (what, every) in reads.items():
        gain = whatif.gain(events, whatif.without_syncs(f"{path.name}:{line}"), target)
        if gain > 0:
            rate = "every step" if every == 1 else f"every {every} steps"
            out.append(make("per-step sync", f"{what}() {rate} in a loop drains the device", f"{path.name}:{line}",
                            gain,
                            "read the value every N steps, or keep it on the device and read it once"))
    gain = whatif.gain(events, whatif.pinned, target)
    if gain > 0:
        out.append(make("pinned memory", "inputs copied to the device from pageable memory, blocking the host",
                        path.name, gain, "DataLoader(pin_memory=True) and .to('hpu', non_blocking=True)"))
    out += _graphs(events, target, path.name, make, train)
    return out


# Here HPU Graphs (wrap_in_hpu_graph, mode="reduce-overhead") replay inference graphs only: a training step's
# capture is Gaudi's make_graphed_callables, which the advice names for Gaudi.
GRAPH_FIXES = {False: "wrap the model with hpu_backend.gaudi.wrap_in_hpu_graph, or "
                      "torch.compile(mode='reduce-overhead')",
               True: "on Gaudi, capture the forward and backward with habana_frameworks.torch.hpu."
                     "make_graphed_callables (HPU Graphs for training; the simulated device replays inference "
                     "graphs only)"}


def _graphs(events: list[tuple], target: str, where: str, make, train: bool) -> list:
    steps = whatif.steps_of(events, target)
    gain = whatif.gain(events, whatif.hpu_graphs, target)
    if gain <= 0 or not any(s.bound == "host" for s in steps):
        return []
    host = sum(s.host_s for s in steps) / len(steps)
    step = "training step" if train else "step"
    return [make("hpu graphs", f"the {step} is host-bound: {host * 1e6:.0f} µs of the bridge's dispatch per step "
                 "(estimate)", where, gain, GRAPH_FIXES[train])]


def step_events(recipes: list, input_bytes: int, pinned: bool, non_blocking: bool, reads: dict,
                file: str) -> list[tuple]:
    """``STEPS`` steps of: the inputs' copy, each recipe's ops and launch, the loop's host reads."""
    launches = []
    for i, r in enumerate(recipes, 1):
        ops = sum(1 for n in r.nodes if n.engine not in ("view",))
        launches += [("op", "lazy")] * ops + [("launch", "lazy", r.name, i, cost_of(r.facts), 0.0)]
    events = []
    for step in range(STEPS):
        events.append(("copy", input_bytes, True, pinned, non_blocking, file))
        events += launches
        events.append(("step",))
        events += [("sync", what, f"{file}:{line}") for line, (what, every) in reads.items() if step % every == 0]
    return events


def loop_reads(tree: ast.AST) -> dict[int, tuple[str, int]]:
    """Line -> (the read, once every how many steps) for each host read inside a ``for`` or ``while`` loop."""
    found: dict[int, tuple[str, int]] = {}
    for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))):
        for node, every in _walk(loop.body, 1):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READS:
                found.setdefault(node.lineno, (f".{node.func.attr}", every))
    return found


def _walk(body: list, every: int):
    """Every node under ``body`` with how often it runs: ``if i % N == 0`` divides the rate by N."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            n = _modulo(stmt.test)
            yield from _walk(stmt.body, every * n if n else every)
            yield from _walk(stmt.orelse, every)
            yield from ((node, every) for node in ast.walk(stmt.test))
        else:
            yield from ((node, every) for node in ast.walk(stmt))


def _modulo(test: ast.AST) -> int | None:
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, int) and node.right.value > 1:
            return node.right.value
    return None


def _says(tree: ast.AST, name: str) -> bool:
    """The file passes ``name=True`` somewhere, or calls ``.name()``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name and getattr(node.value, "value", None) is True:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
            return True
    return False


def _source(spec) -> tuple[ast.AST | None, Path]:
    path = Path(spec.path.split(":")[0])
    try:
        return ast.parse(path.read_text()), path
    except (OSError, SyntaxError, ValueError):
        return None, path


def _input_bytes(spec, point: dict) -> int:
    inputs = spec.inputs(point) if point else ()
    return sum(t.numel() * t.element_size() for t in inputs if hasattr(t, "element_size"))
