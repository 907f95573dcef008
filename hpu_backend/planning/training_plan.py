"""A whole training step planned across cards without weights: forward, backward and the optimizer update,
per-card memory by category, data parallelism with ZeRO stages 0-3, tensor parallelism, DDP gradient buckets
and activation checkpointing; tokens/s, samples/s and the largest micro-batch that fits.

The forward is one card's tensor-parallel shard (``PER_CARD(tp)``; without one, at ``tp`` 1, the model file's
own model), lowered once on the meta device and
re-planned at every micro-batch (``capacity.trace_step``; LLaMA-style stacks from their one- and two-layer
lowerings, ``capacity.LayeredStep``). Everything else follows from it, per DeepSpeed's ZeRO paper (Rajbhandari
et al., 2020) for a mixed-precision AdamW step with Ψ parameters on a card after tensor parallelism:

============================  ==========================================  =====================================
per-card memory               held                                        ZeRO stage that shards it over DP
============================  ==========================================  =====================================
parameters                    2Ψ (bf16)                                   3
gradients                     2Ψ (bf16; DDP's buckets are views of them)   2, 3
master weights                4Ψ (fp32 copy the optimizer updates)        1, 2, 3
optimizer state               8Ψ (AdamW's two fp32 moments)               1, 2, 3
saved activations             the forward's intermediates (memory plan)   none (checkpointing: layer inputs)
communication buffers         two gradient buckets in flight, the TP       -
                              all-reduce, ZeRO-3's gathered layers
============================  ==========================================  =====================================

Time of one step: per micro-batch, forward + backward (2 × the forward's compute, as for every matmul's two
gradients) + the recompute of the forward under ``checkpointing="full"``, with the tensor-parallel all-reduces
of forward and backward as the lowered forward exposes them; then the data-parallel collectives each stage
adds (stage 0/1: bucketed gradient all-reduce overlapped with the last micro-batch's backward; stage 2:
bucketed reduce-scatter every micro-batch; stage 3: parameter all-gathers in forward and backward and
gradient reduce-scatter; stages 1/2: the updated parameters' all-gather after the step) costed on the
target's scale-up fabric (``targets.Fabric.collective_s``), and the optimizer update (AdamW reads and writes
28 bytes a parameter it owns, at HBM speed). ``TRAIN_EFFICIENCY`` scales the compute (fitted, see below).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch

from ..targets import device, fabric, layout_problem
from ..timeline.training import TrainingStep, schedule as schedule_training
from ..diagnosis.analyze import hbm_bytes, largest_fitting
from .capacity import DTYPES, CapacityError, LayeredStep, StepGraph, TP_GROUP, check_context, trace_step
from ..lowering.values import numel
from ..modelfiles.modelspec import ModelSpec, spec_from, user_call

# The share of the forward-derived compute a training step sustains, fitted on the one published row named in
# the README (Intel, Gaudi 2, software 1.18.0: LLaMA 2 7B, 8 cards, sequence 4096, fp8, global batch 1024 ->
# 68,464 tokens/s) with bench/train_bench.py; no other published row enters the fit.
TRAIN_EFFICIENCY = 0.75
ADAMW_BYTES_PER_PARAM = 28  # read fp32 master, m, v + bf16 grad; write master, m, v + bf16 parameter
CHECKPOINTING = ("none", "full")
ZERO_STAGES = (0, 1, 2, 3)
DEFAULT_BUCKET_MB = 25.0  # torch DDP's bucket_cap_mb default


@dataclass(frozen=True)
class Layout:
    """How one training step is spread: ``cards`` = ``dp`` × ``tp``; ``micro_batch`` sequences per card and
    micro-step, ``accumulation`` micro-steps per optimizer step."""

    cards: int
    tp: int
    zero: int
    checkpointing: str
    bucket_mb: float
    micro_batch: int = 0
    accumulation: int = 0

    @property
    def dp(self) -> int:
        return self.cards // self.tp


@dataclass
class ForwardShard:
    """One card's forward at a micro-batch: the lowered step plus the model's LM-head and hidden width."""

    step: Any  # StepGraph | LayeredStep
    layers: int
    hidden: int  # the width of a layer's input (what full checkpointing keeps per layer)
    head: tuple[int, int]  # (in, out) features of the LM head on this card (0, 0 without one)

    def at(self, batch: int, seq: int) -> dict[str, Any]:
        """Forward time, its TP communication, and the activations it saves/needs at (batch, seq)."""
        point = {"batch": batch, "input_len": seq, "seq": seq}
        graphs = [self.step] if isinstance(self.step, StepGraph) else [self.step.one, self.step.two]
        recipes = [g.at(point) for g in graphs]
        est = self.step.estimate(point)
        saved = [r.facts["memory"]["intermediate_bytes"] + r.facts["memory"]["output_bytes"] for r in recipes]
        params = [sum(numel(s, r.facts["plan_at"]) for s in r.inputs[:g.params]) for r, g in zip(recipes, graphs)]
        layer_saved = saved[-1] - saved[0] if len(saved) == 2 else saved[0] / max(self.layers, 1)
        total_saved = saved[0] + (self.layers - 1) * layer_saved if len(saved) == 2 else saved[0]
        total_params = params[0] + (self.layers - 1) * (params[-1] - params[0]) if len(params) == 2 else params[0]
        tokens = batch * seq
        head_in, head_out = self.head
        return {"layers": self.layers, "time_s": est["time_s"], "comm_s": est["comm_s"],
                "exposed_comm_s": est["exposed_comm_s"],
                "collectives": est["collectives"], "parameters": total_params,
                "saved_bytes": round(total_saved), "layer_saved_bytes": round(layer_saved),
                "arena_bytes": est["hbm"]["activation_bytes"], "tp_buffer_bytes": est["hbm"]["comm_buffer_bytes"],
                "layer_input_bytes": tokens * self.hidden * 2,
                # the LM head over every position (the lowered prefill step reads the last one) and the
                # loss's fp32 logits: transient, at the end of the forward
                "head_flops": 2.0 * tokens * head_in * head_out, "logits_bytes": tokens * head_out * (2 + 4)}


def forward_shard(spec: ModelSpec, target: str, dtype: str, tp: int) -> ForwardShard:
    """The forward of one card's shard over ``tp`` cards (lowered once; LayeredStep when LAYERS > 2)."""
    if dtype not in DTYPES:
        raise CapacityError(f"dtype {dtype!r}: expected {' or '.join(DTYPES)}")
    if spec.per_card is None:
        if tp > 1:
            raise CapacityError(f"{spec.path}: tensor parallel over {tp} cards needs PER_CARD(cards, group, layers) "
                                f"in the model file (one card's tensor-parallel shard, see models/llama.py)")
        # without PER_CARD the model file is the one card's model, planned as one block
        return ForwardShard(trace_step(spec, "train_forward", target, dtype, {TP_GROUP: 1}), spec.layers or 1,
                            *_widths(spec))

    def shard(layers: int | None) -> tuple[StepGraph, ModelSpec]:
        holder = user_call(spec.path, f"PER_CARD(cards={tp})", spec.per_card, cards=tp, group=TP_GROUP,
                           layers=layers)
        card = spec_from(holder, f"{spec.path}:PER_CARD")
        return trace_step(card, "train_forward", target, dtype, {TP_GROUP: tp}), card

    layers = spec.layers or 1
    if layers <= 2:
        step, card = shard(None)
    else:
        (one, card), (two, _) = shard(1), shard(2)
        step = LayeredStep(one, two, layers, hbm_bytes(target))
    return ForwardShard(step, layers, *_widths(card))


def _widths(card: ModelSpec) -> tuple[int, tuple[int, int]]:
    """The hidden width (the first embedding's) and the LM head's (in, out) (the last linear layer's)."""
    with torch.device("meta"):
        model = card.build_model()
    embeds = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    hidden = embeds[0].embedding_dim if embeds else (linears[0].in_features if linears else 0)
    head = (linears[-1].in_features, linears[-1].out_features) if linears else (0, 0)
    return hidden, head


# -- memory ---------------------------------------------------------------------------------------------------

def memory(layout: Layout, fwd: dict[str, Any]) -> dict[str, int]:
    """Per-card bytes by category at ``fwd`` (a ForwardShard.at) under ``layout``."""
    psi = fwd["parameters"]  # parameters on this card after TP
    dp, z = layout.dp, layout.zero
    bucket = layout.bucket_mb * 2**20
    if layout.checkpointing == "full":  # each layer's input, plus one layer's activations while recomputing
        saved = fwd["layer_input_bytes"] * _layers(fwd) + fwd["layer_saved_bytes"]
    else:
        saved = fwd["saved_bytes"]
    comm = 2 * bucket + fwd["tp_buffer_bytes"]
    if z == 3:  # the layer being computed and the next one, gathered whole
        comm += 2 * 2 * psi / _layers(fwd)
    return {"parameters_bytes": round(2 * psi / (dp if z >= 3 else 1)),
            "gradients_bytes": round(2 * psi / (dp if z >= 2 else 1)),
            "master_weights_bytes": round(4 * psi / (dp if z >= 1 else 1)),
            "optimizer_state_bytes": round(8 * psi / (dp if z >= 1 else 1)),
            "activations_bytes": round(saved + fwd["arena_bytes"] + fwd["logits_bytes"]),
            "comm_buffers_bytes": round(comm)}


def _layers(fwd: dict[str, Any]) -> int:
    return fwd["layers"]


# -- time -----------------------------------------------------------------------------------------------------

def collectives(layout: Layout, psi: float, net, layers: int = 1) -> list[dict[str, Any]]:
    """The data-parallel collectives of one optimizer step: kind, bytes of each, count, when, seconds each."""
    dp, z = layout.dp, layout.zero
    if dp == 1:
        return []
    grad_bytes, bucket = 2 * psi, layout.bucket_mb * 2**20
    buckets = max(math.ceil(grad_bytes / bucket), 1)
    each = grad_bytes / buckets
    rows = []

    def add(kind: str, nbytes: float, count: int, when: str) -> None:
        rows.append({"kind": kind, "bytes": round(nbytes), "count": count, "when": when,
                     "seconds_each": net.collective_s(kind, nbytes, dp)})

    if z <= 1:  # DDP / stage 1: every bucket all-reduced once per step (no_sync on the other micro-steps)
        add("all_reduce", each, buckets, "backward of the last micro-step")
    else:  # stages 2, 3: every micro-step's gradients reduce-scattered bucket by bucket
        add("reduce_scatter", each, buckets * layout.accumulation, "backward of every micro-step")
    if z in (1, 2):  # each card updated its partition: gather the parameters
        add("all_gather", 2 * psi, 1, "after the optimizer step")
    if z == 3:  # parameters gathered layer by layer, for the forward and again for the backward
        add("all_gather", 2 * psi / layers, 2 * layout.accumulation * layers,
            "forward and backward of every micro-step, layer by layer")
    return rows


def step_time(layout: Layout, fwd: dict[str, Any], target: str, dtype: str,
              keep: list | None = None) -> dict[str, Any]:
    """Seconds of one optimizer step and where they go (all estimates): the step on the timeline
    (``timeline/training.py``), its compute and collectives overlapping only where the schedule allows.
    ``keep``: a list the timeline's trace spans are added to."""
    dev, net = device(target), fabric(target)
    psi = fwd["parameters"]
    mme = dev.mme_peak("float8_e4m3fn" if dtype == "fp8" else "bfloat16") * dev.efficiency.mme
    fwd_compute = fwd["time_s"] - fwd["exposed_comm_s"] + fwd["head_flops"] / mme
    passes = 3 + (1 if layout.checkpointing == "full" else 0)  # forward, backward (2x), recompute
    compute = passes * fwd_compute / TRAIN_EFFICIENCY
    tp_exposed = (passes - 1) * fwd["exposed_comm_s"]  # backward's all-reduces mirror the forward's
    micro = compute + tp_exposed
    rows = collectives(layout, psi, net, _layers(fwd))
    owned = psi / (layout.dp if layout.zero >= 1 else 1)
    optimizer = owned * ADAMW_BYTES_PER_PARAM / (dev.hbm_bytes_per_s * dev.efficiency.hbm)
    timeline = schedule_training(TrainingStep(
        layers=_layers(fwd), forward_s=micro / passes, backward_s=micro * (passes - 1) / passes,
        accumulation=layout.accumulation, optimizer_s=optimizer,
        gather_s=next((r["seconds_each"] for r in rows if r["when"].startswith("forward")), 0.0),
        grads=tuple((r["kind"], r["seconds_each"], r["count"] // (layout.accumulation if "every" in r["when"] else 1),
                     "every" in r["when"]) for r in rows if r["when"].startswith("backward")),
        after=tuple((r["kind"], r["seconds_each"]) for r in rows if r["when"].startswith("after"))),
        spans=keep is not None)
    if keep is not None:
        keep.extend(timeline["spans"])
    for r in rows:
        r["exposed_s"] = timeline["exposed_s"].get(r["kind"], 0.0)
    exposed = timeline["step_s"] - layout.accumulation * micro - optimizer
    comm = sum(r["seconds_each"] * r["count"] for r in rows) + layout.accumulation * (passes - 1) * fwd["comm_s"]
    return {"step_s": timeline["step_s"], "micro_step_s": micro, "compute_s": layout.accumulation * compute,
            "optimizer_s": optimizer, "comm_s": comm,
            "exposed_comm_s": exposed + layout.accumulation * tp_exposed, "collectives": rows,
            "tp_collectives_per_micro_step": round((passes - 1) * fwd["collectives"])}


# -- the plan -------------------------------------------------------------------------------------------------

def plan_training(spec: ModelSpec, target: str, dtype: str, seq: int, global_batch: int, cards: int = 1,
                  zero: int = 0, tp: int = 1, bucket_mb: float = DEFAULT_BUCKET_MB, checkpointing: str = "none",
                  micro_batch: int | None = None, search: bool = False,
                  on_step: Callable[[str], None] | None = None, trace: str | None = None) -> dict[str, Any]:
    """One training step's plan (or with ``search``, the fastest layout that fits); a JSON-ready dict.
    ``on_step(what)`` hears each stage as it starts (a front end's progress line). ``trace``: write the planned
    optimizer step as a step-timeline trace (``plan_trace.write_training``)."""
    _check(target, seq, global_batch, cards, zero, tp, bucket_mb, checkpointing, micro_batch)
    check_context(spec, seq, f"--seq {seq}")
    step = on_step or (lambda what: None)
    if not search:
        layout = Layout(cards, tp, zero, checkpointing, bucket_mb)
        step(f"tracing and lowering the forward of one card (tp {tp})")
        shard = forward_shard(spec, target, dtype, tp)
        doc = plan_layout(shard, spec.name, layout, target, dtype, seq, global_batch, micro_batch)
        return _traced(doc, shard, trace)
    tried, shards = [], {}
    for t in (d for d in range(1, cards + 1) if cards % d == 0):
        step(f"tracing and lowering the forward of one card (tp {t})")
        try:
            shards[t] = forward_shard(spec, target, dtype, t)
        except CapacityError:
            continue  # the model does not split over t cards
        for z in ZERO_STAGES:
            for ck in CHECKPOINTING:
                step(f"layout tp {t}, ZeRO {z}, checkpointing {ck}")
                tried.append(plan_layout(shards[t], spec.name, Layout(cards, t, z, ck, bucket_mb), target, dtype,
                                         seq, global_batch, micro_batch))
    fitting = [d for d in tried if d["fits_hbm"] and d["tokens_per_s"]]
    best = max(fitting, key=lambda d: d["tokens_per_s"]) if fitting else tried[0]
    best["search"] = [{"layout": d["layout"], "tokens_per_s": d["tokens_per_s"], "fits_hbm": d["fits_hbm"]}
                      for d in tried]
    return _traced(best, shards[best["layout"]["tp"]], trace)


def _traced(doc: dict[str, Any], shard: ForwardShard, trace: str | None) -> dict[str, Any]:
    """Write the trace of ``doc``'s optimizer step (planned again with its spans kept) when asked; ``doc``."""
    if not trace or not doc.get("step"):
        return doc
    from .plan_trace import write_training

    lay, spans = doc["layout"], []
    layout = Layout(lay["cards"], lay["tp"], lay["zero"], lay["checkpointing"], lay["bucket_mb"], lay["micro_batch"],
                    lay["accumulation"])
    step_time(layout, shard.at(lay["micro_batch"], doc["seq"]), doc["target"], doc["dtype"], keep=spans)
    write_training(trace, spans, doc)
    return doc


def _check(target, seq, global_batch, cards, zero, tp, bucket_mb, checkpointing, micro_batch) -> None:
    if min(seq, global_batch, cards, tp) < 1 or (micro_batch is not None and micro_batch < 1):
        raise CapacityError("sequence, global batch, cards, --tp and the micro-batch must be positive integers")
    if zero not in ZERO_STAGES:
        raise CapacityError(f"--zero {zero}: expected 0, 1, 2 or 3")
    if checkpointing not in CHECKPOINTING:
        raise CapacityError(f"--checkpointing {checkpointing!r}: expected {' or '.join(CHECKPOINTING)}")
    if not bucket_mb > 0:
        raise CapacityError(f"--bucket-mb {bucket_mb}: expected a positive size in MB")
    problem = layout_problem(target, cards, tp, global_batch)
    if problem:
        raise CapacityError(problem)


def plan_layout(shard: ForwardShard, model: str, layout: Layout, target: str, dtype: str, seq: int,
                global_batch: int, micro_batch: int | None) -> dict[str, Any]:
    """The plan of one layout from a card's forward (``forward_shard`` at ``layout.tp``)."""
    hbm = hbm_bytes(target)
    per_card = global_batch // layout.dp

    def per_card_bytes(b: int) -> int:
        return sum(memory(layout, shard.at(b, seq)).values())

    largest, note = largest_fitting(lambda b: per_card_bytes(b) <= hbm)
    chosen = micro_batch or _divisor_at_most(per_card, largest)
    doc = {"model": model, "target": target, "dtype": dtype, "estimate": True, "mode": "train",
           "cards": layout.cards, "hbm_bytes": hbm, "seq": seq, "global_batch": global_batch,
           "max_batch": {"batch": largest, **({"note": note} if note else {}),
                         **({} if largest else {"reason": "even micro-batch 1 does not fit"})},
           "layout": None, "memory": None, "tokens_per_s": None, "samples_per_s": None, "fits_hbm": False}
    if not chosen:
        doc["layout"] = asdict(layout) | {"dp": layout.dp}
        return doc
    layout = replace(layout, micro_batch=chosen, accumulation=math.ceil(per_card / chosen))
    fwd = shard.at(chosen, seq)
    mem = memory(layout, fwd)
    t = step_time(layout, fwd, target, dtype)
    total = sum(mem.values())
    doc.update({"layout": asdict(layout) | {"dp": layout.dp}, "memory": mem | {"total_bytes": total},
                "fits_hbm": total <= hbm, "batch": chosen, "step": t, "step_s": t["step_s"],
                "tokens_per_s": global_batch * seq / t["step_s"], "samples_per_s": global_batch / t["step_s"],
                "comm_share": t["exposed_comm_s"] / t["step_s"],
                "collectives_per_step": sum(r["count"] for r in t["collectives"])
                + layout.accumulation * t["tp_collectives_per_micro_step"]})
    return doc


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` (so the micro-steps add up to the batch); 0 if none."""
    return max((d for d in range(1, min(n, cap) + 1) if n % d == 0), default=0)


