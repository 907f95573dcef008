"""The Gaudi optimization checklist run over a model file (what ``hpurecipe advise`` prints).

The checklist of the Intel Gaudi docs has three phases: port (CPU fallbacks, ``mark_step``), optimize
(batch size, HPU Graphs, autocast, static shapes, fused optimizers, FusedSDPA) and profile (excessive
recompilations). ``advise`` answers it from what the product already knows, without a Gaudi: the recipes of a
compile-only run at every point of the model file (placement, fusion, memory plan, cost estimate), the
recompiles explained while they were compiled (``serve/recompiles.py``), Dynamo's graph breaks with their
source lines, the largest batch that fits, and a reading of the model file's source (never run) for the
optimizer, gradient clipping and autocast it uses. Each ``Finding`` says what, where (a source line, else
a graph), why per the docs, and the time the change would save per step where the cost model can tell
(an estimate, like every device time here). Most valuable first: findings with an estimated gain, largest
first, then the others (no estimate, or none at the planned shapes) in checklist order.

Advice is about the user's own code. A line in library code (transformers, torch, site-packages) is named as
such (``Finding.library``), and the finding points at the user's frame: the model file's ``make_model`` that
builds the library model, or for a shape the ``AXES`` entry that asks for it. A recompile is explained by its
real cause: with ``dynamic: True`` already set, a size of 0 or 1 still gets a graph of its own (Dynamo's 0/1
specialization), and a size-range guard holds a graph to the sizes it was compiled for.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .. import metrics
from ..serve import hbm
from ..serve.recompiles import LOOP_CONSTANT_FIX
from ..serve.sources import library_location
from .analyze import _max_batch, hbm_bytes
from . import timeline_advice
from ..modelfiles.modelspec import ModelSpec, model_call, point_label
from ..shipping.warm import PointResult, plan

# The checks in checklist order (port, optimize, profile): the order of findings without a gain estimate.
CHECKS = ("hbm", "cpu fallback", "host sync", "graph break", "recompile", "buckets", "hand-written attention",
          "autocast", "unfused optimizer", "gradient clipping", "batch size", "hpu graphs", "per-step sync",
          "pinned memory")

DOCS = {
    "hbm": "a graph whose plan exceeds HBM fails on the device; the docs split it with mark_step, recompute "
           "attention with FusedSDPA, or lower the batch",
    "cpu fallback": "ops that fall back to the CPU split the device graph and copy tensors to and from the "
                    "host; the docs' first porting step is to remove them (Placement of Ops on HPU)",
    "host sync": "reading a tensor's value on the host (.item(), printing, Python control flow on a tensor) "
                 "ends the graph and waits for the device; the docs advise keeping such reads out of the step",
    "graph break": "each graph break ends a device graph and starts another, with a host round trip between",
    "recompile": "every recompile lowers and compiles new recipes (seconds to minutes each on Gaudi); the "
                 "docs' profile phase looks for excessive recompilations",
    "buckets": "a dynamic dimension without buckets compiles one recipe per size; bucketing (padding to a "
               "few sizes) bounds the recipes, as the bridge's dynamic-shape support does",
    "hand-written attention": "softmax(QKᵀ)V written out runs as separate matmuls and a softmax whose "
                              "S×S scores go through HBM; FusedSDPA keeps them on chip",
    "autocast": "matmuls in fp32 run at a fraction of the MME's bf16 rate; the docs recommend bf16 mixed "
                "precision (autocast) for training and inference",
    "unfused optimizer": "a torch.optim optimizer launches several small kernels per parameter; the fused "
                         "Gaudi optimizers (FusedAdamW, FusedSGD) update all parameters in one",
    "gradient clipping": "torch.nn.utils.clip_grad_norm_ computes the norm with many small kernels; the docs "
                         "recommend FusedClipNorm",
    "batch size": "a larger batch is, in general, better for throughput until HBM is full (docs: Batch Size)",
    "hpu graphs": "a host-bound inference model spends more time launching than computing; HPU Graphs record "
                  "the launches once and replay them (docs: HPU Graphs for inference)",
    "per-step sync": "a host read in the training loop (.item() for a print or a log) waits every step until "
                     "the device drains, so host and device stop overlapping; the docs reduce the frequency of "
                     "printing",
    "pinned memory": "a copy from pageable memory is staged by the host and blocks it; the docs pin the data "
                     "loader's memory and copy with non_blocking=True",
}
# What differs for a training run (``--train``): Gaudi's HPU Graphs for training capture the forward and backward.
TRAINING_DOCS = {
    "hpu graphs": "a host-bound training step spends more time launching than computing; HPU Graphs record the "
                  "launches of the forward and backward once and replay them (docs: HPU Graphs for training)",
}


def why(check: str, train: bool) -> str:
    """The docs' reason for a check, as it reads for this run's mode."""
    return TRAINING_DOCS.get(check, DOCS[check]) if train else DOCS[check]


@dataclass(frozen=True)
class Finding:
    check: str  # one of CHECKS
    what: str
    where: str  # "model.py:12", or a graph name when no source line is known
    why: str
    gain_s: float | None = None  # estimated device time saved per step (an estimate), None when not estimated
    fix: str = ""
    library: str = ""  # the line of library code the finding is about, when ``where`` is the user's frame

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def advise(spec: ModelSpec, train: bool = False, target: str = "gaudi2",
           on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The checklist's findings for ``spec`` on ``target``, most valuable first (a JSON-ready dict).
    ``on_step(what)`` hears each stage as it starts (a front end's progress line)."""
    step = on_step or (lambda what: None)
    with _quiet("torch._dynamo", "hpu_backend.serve.recompiles"):  # the findings carry what these log
        step("graph breaks (Dynamo's explain at the first point)")
        breaks = graph_breaks(spec, train)
        seen = len(metrics.recompiles())
        step(f"compiling and planning {len(spec.points())} points, twice each")
        points = plan(spec, train=train, target=target, repeat=2)  # a steady loop's second step compiles nothing
        recompiled = metrics.recompiles()[seen:]
        step("the largest batch that fits")
        batch = _batch(spec, points, train, target)  # its probes recompile too: counted in its finding only
    step("the checklist over the recipes and the source")
    largest = points[-1] if points else None
    recipes = [u.recipe for u in largest.used] if largest else []
    findings = [*_hbm(recipes), *_fallbacks(recipes, spec), *_breaks(breaks, spec), *_recompiles(recompiled, spec),
                *_buckets(spec), *_attention(recipes, spec), *_autocast(recipes, target), *_source(spec),
                *batch, *_timeline(spec, recipes, largest, target, train)]
    findings.sort(key=lambda f: (not f.gain_s, -(f.gain_s or 0.0), CHECKS.index(f.check)))
    return {"model": spec.name, "target": target, "mode": "train" if train else "inference",
            "planned_at": largest.point if largest else {}, "estimate": True,
            "findings": [f.to_dict() for f in findings]}


@contextlib.contextmanager
def _quiet(*names: str):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def graph_breaks(spec: ModelSpec, train: bool) -> list[tuple[str, str]]:
    """Dynamo's graph breaks at the first point: (reason's first line, the user's source line)."""
    import torch
    import torch._dynamo

    model = spec.build_model().train(train)
    inputs = spec.split(spec.inputs(spec.points()[0]))
    with torch.no_grad():
        out = model_call(spec.path, f"the model at {point_label(spec.points()[0])}", torch._dynamo.explain(model),
                         *inputs, eager=model)
    torch._dynamo.reset()
    found = []
    for b in out.break_reasons:
        stack = getattr(b, "user_stack", None) or []
        where = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else ""
        found.append((str(getattr(b, "reason", b)).splitlines()[0], where))
    return sorted(set(found))


def _short(source: str) -> str:
    return Path(source.rsplit(":", 1)[0]).name + ":" + source.rsplit(":", 1)[1] if ":" in source else source


def _place(source: str, spec: ModelSpec) -> tuple[str, str]:
    """(where, library) for a source line: the line itself when it is the user's; for a line of library code,
    the model file's make_model (the user's frame that builds the library model) and the library line."""
    library = library_location(source)
    return (_model_line(spec, "make_model"), library) if library else (_short(source), "")


def _in_library(what: str, library: str) -> str:
    return f"{what} (in library code: {library})" if library else what


def _model_line(spec: ModelSpec, name: str) -> str:
    """"model.py:N" where the model file defines or assigns ``name``; the file alone when it cannot tell."""
    path = Path(spec.path.split(":", 1)[0])
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return path.name
    for node in ast.walk(tree):
        named = getattr(node, "name", None) == name or any(
            getattr(t, "id", None) == name for t in getattr(node, "targets", [getattr(node, "target", None)]))
        if named:
            return f"{path.name}:{node.lineno}"
    return path.name


def _hbm(recipes) -> list[Finding]:
    return [Finding("hbm", hbm.overflow(r).split("; ", 1)[0], r.name, DOCS["hbm"], fix=hbm.REMEDIES)
            for r in recipes if not r.facts.get("memory", {}).get("fits_hbm", True)]


def _fallbacks(recipes, spec: ModelSpec) -> list[Finding]:
    where: dict[str, str] = {}
    cost: dict[str, float] = defaultdict(float)
    for r in recipes:
        ops = [n for n in r.nodes if n.placement == "cpu" and n.engine not in ("view", "host")]
        names = {n.op for n in ops}
        c = r.facts.get("cost", {})
        for n in ops:
            where.setdefault(n.op, n.source or r.name)
        for op in names:  # the graph's CPU and transfer time, shared among its fallback ops
            cost[op] += (c.get("cpu_s", 0.0) + c.get("transfer_s", 0.0)) / len(names)
    out = []
    for op in sorted(where):
        at, library = _place(where[op], spec)
        out.append(Finding("cpu fallback", _in_library(f"{op} runs on the CPU", library), at, DOCS["cpu fallback"],
                           cost[op], "use an op the HPU supports (see `hpurecipe show` for the op and dtype), or "
                                     "another dtype", library))
    return out


SYNC_WORDS = ("item()", ".item", "tolist", "data-dependent", "data dependent", "generic_jump", "print")


def _breaks(breaks, spec: ModelSpec) -> list[Finding]:
    out = []
    for reason, source in breaks:
        sync = any(w in reason.lower() for w in SYNC_WORDS)
        where, library = _place(source, spec) if source else ("-", "")
        out.append(Finding("host sync" if sync else "graph break", _in_library(reason, library), where,
                           DOCS["host sync" if sync else "graph break"],
                           fix="keep the value on the device (torch.where, masks) or read it once after the step"
                           if sync else "see the reason; torch._dynamo.explain lists every break", library=library))
    return out


def _recompiles(recompiled: list[dict], spec: ModelSpec) -> list[Finding]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in recompiled:
        explained = _recompile_cause(r["cause"], r["change"], r["source"], spec)
        groups[r["function"], r["cause"], r["variable"], r["source"], r.get("library", ""), explained].append(r)
    out = []
    for (function, cause, variable, source, library, (where, why, fix)), rs in groups.items():
        values = sorted({v for r in rs for v in r["change"].split(" -> ") if r["change"]})
        if cause in ("constant", "module attribute") and len(values) >= 3:
            what = (f"{function} compiles a new graph for every value of {variable} ({', '.join(values)}): the "
                    f"loop constant pattern")
            fix = LOOP_CONSTANT_FIX
        else:
            what = f"{function} recompiled {len(rs)}× on {cause}" + (f" ({variable} {rs[-1]['change']})"
                                                                     if variable else "") + why
        if library:
            where = where if where != source else _model_line(spec, "make_model")
            what = _in_library(what, f"{library}:{source.rsplit(':', 1)[-1]}")
        out.append(Finding("recompile", what, where, DOCS["recompile"], fix=fix, library=library))
    return out


_SIZE_CHANGE = re.compile(r"dim (?P<dim>\d+): (?P<old>[\d.]+) -> (?P<new>\d+|\?)$")


def _recompile_cause(cause: str, change: str, source: str, spec: ModelSpec) -> tuple[str, str, str]:
    """(where, why, fix) for one recompile: the user's line, the real cause in words, the fix."""
    fixed = {"dtype": "feed one dtype", "requires_grad": "keep requires_grad the same across calls",
             "grad mode": "compile inference and training separately"}
    m = _SIZE_CHANGE.search(change) if cause == "input shape" else None
    if m is None:
        return source, "", fixed.get(cause, "")
    old, new = m["old"], m["new"]
    axes = [a for a, v in spec.axes.items() if new.isdigit() and int(new) in v]
    axis = axes[0] if len(axes) == 1 else ""
    specialized = (spec.dynamic and {old, new} & {"0", "1"}) or (old.startswith("2..") and new in ("0", "1"))
    if specialized:
        size = old if old in ("0", "1") else new
        where = _model_line(spec, "AXES") if axis else source
        return where, (f": Dynamo specializes sizes 0 and 1 even with dynamic shapes, so {axis or 'the size'}="
                       f"{size} has a graph of its own"), (
            f"expected once: leave {size} out of AXES['{axis}'] (pad it to 2), or mark the dimension "
            f"unbacked (torch._dynamo.decorators.mark_unbacked) to share one graph" if axis else
            "pad the size to 2, or mark the dimension unbacked (torch._dynamo.decorators.mark_unbacked)")
    if ".." in old:
        return source, f": the graph holds for sizes {old} only (a size-range guard)", (
            "expected once per range (torch chooses some kernels, convolutions among them, by size): warm a point "
            "in each range" + (f" (AXES['{axis}'])" if axis else "") + " so that serving compiles nothing")
    if spec.dynamic:
        return source, ": the code specialized the size although dynamic shapes are on", (
            "find what reads the size as a number (a branch on x.shape, a size passed to Python); "
            "TORCH_LOGS=dynamic names the line")
    return source, "", "mark the dimension dynamic (COMPILE = {\"dynamic\": True}, or torch._dynamo.mark_dynamic) " \
                       "and give it buckets"


def _buckets(spec: ModelSpec) -> list[Finding]:
    setting = spec.options.get("buckets", "exp")
    varying = [a for a, v in spec.axes.items() if len(set(v)) >= 3]
    if not spec.dynamic or setting != "exact" or not varying:
        return []
    return [Finding("buckets", f"dynamic axes {', '.join(varying)} compile one recipe per size (buckets='exact')",
                    spec.path, DOCS["buckets"], fix="use buckets='exp' (powers of two) or a list of sizes")]


def _attention(recipes, spec: ModelSpec) -> list[Finding]:
    saving: dict[str, float] = defaultdict(float)
    for r in recipes:
        for a in r.facts.get("cost", {}).get("handwritten_attention", []):
            saving[a["source"] or r.name] += a["fused_saving_s"]
    out = []
    for source, s in sorted(saving.items()):
        where, library = _place(source, spec)
        fix = ("call torch.nn.functional.scaled_dot_product_attention or hpu_backend.gaudi.FusedSDPA.apply" +
               ("; for a transformers model, load it with attn_implementation=\"sdpa\"" if library else ""))
        out.append(Finding("hand-written attention", _in_library("attention written out as softmax(QKᵀ)V", library),
                           where, DOCS["hand-written attention"], s, fix, library))
    return out


def _autocast(recipes, target: str) -> list[Finding]:
    from ..targets import device

    dev = device(target)
    ratio = dev.mme_peak("float32") / dev.mme_peak("bfloat16")
    fp32 = [r for r in recipes if any(n.engine == "mme" and n.out and n.out[0].dtype == "float32" for n in r.nodes)]
    if not fp32:
        return []
    gain = 0.0
    for r in fp32:
        for c in r.facts.get("cost", {}).get("clusters", []):
            faster = max(c["mme_s"] * ratio, c["tpc_s"], c["hbm_s"])
            gain += max(c["mme_s"], c["tpc_s"], c["hbm_s"]) - faster
    return [Finding("autocast", "matmuls run in float32", fp32[0].name, DOCS["autocast"], gain,
                    "wrap the step in hpu_backend.gaudi.autocast() (Gaudi's bf16 lists); the gain counts the "
                    "MME rate only, not the halved HBM traffic")]


# Calls a model file's source can make that the checklist replaces: (what to look for, check, fix)
_CALLS = {
    "AdamW": ("unfused optimizer", "hpu_backend.gaudi.FusedAdamW (habana_frameworks.torch.hpex.optimizers)"),
    "Adam": ("unfused optimizer", "hpu_backend.gaudi.FusedAdamW"),
    "SGD": ("unfused optimizer", "hpu_backend.gaudi.FusedSGD"),
    "clip_grad_norm_": ("gradient clipping", "hpu_backend.gaudi.FusedClipNorm"),
}


def _source(spec: ModelSpec) -> list[Finding]:
    """The optimizer, clipping and autocast calls in the model file's source (read, never run)."""
    path = Path(spec.path.split(":", 1)[0])
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        dotted = ast.unparse(node.func)
        where = f"{path.name}:{node.lineno}"
        if name in _CALLS and (name == "clip_grad_norm_" or "optim" in dotted or name == dotted):
            check, fix = _CALLS[name]
            out.append(Finding(check, f"{dotted}(...)", where, DOCS[check], fix=f"use {fix}"))
        elif name == "autocast" and "hpu" in ast.unparse(node) and "gaudi" not in dotted:
            out.append(Finding("autocast", f"{ast.unparse(node)} casts nothing on the simulated device", where,
                               "torch's HPU autocast kernels do not run on host tensors",
                               fix="use hpu_backend.gaudi.autocast(), which applies Gaudi's bf16 lists"))
    return out


def _batch(spec: ModelSpec, points: list[PointResult], train: bool, target: str) -> list[Finding]:
    if "batch" not in spec.axes:
        return []
    found = _max_batch(spec, points, hbm_bytes(target), train, target) or {}
    largest, fits = max(spec.axes["batch"]), found.get("batch")
    if not fits or fits < 4 * largest:
        return []
    step = found.get("step")
    planned = (f"the whole step planned: gradients, {step['optimizer']} state"
               f"{' (assumed: the file names no optimizer)' if step['assumed'] else ''} and master weights included"
               if step else "planned")
    return [Finding("batch size", f"the largest batch point is {largest}; {fits:,} fit {target}'s HBM ({planned})",
                    _model_line(spec, "AXES"), DOCS["batch size"], fix=f"try batches up to {fits:,} (`hpurecipe "
                                                                         f"analyze{' --train' if train else ''}`)")]


def _timeline(spec: ModelSpec, recipes, largest, target: str, train: bool) -> list[Finding]:
    """Per-step host reads, pageable copies and a host-bound step, each with its gain on the step timeline."""
    def make(check: str, what: str, where: str, gain_s: float, fix: str) -> Finding:
        return Finding(check, what, where, why(check, train), gain_s, fix)

    return timeline_advice.findings(spec, recipes, largest.point if largest else {}, target, make, train)
