"""A model as a serving plan needs it: its prefill and decode steps lowered once per card (capacity's
one- and two-layer lowerings), measured at a few shapes, and surrogates fitted over those measurements so
that any bucket's time, activation memory and compile work costs no lowering.

A measurement re-runs the bucket passes of the lowered step at one shape (``StepGraph.at``): device time
(the cost model), the activations' arena (the memory plan), the weights and KV bytes (its inputs), the nodes the
bridge builds into graphs (every layer's), and the graph compiler's work — the nodes of the distinct graphs it
compiles, each counted once per slice of on-chip memory its output fills (a node whose output exceeds SRAM is
split into that many pieces, each scheduled and compiled). vLLM-Gaudi cuts a graph after every decoder layer, so
in bf16 the compiler sees the first layer with the embedding, one layer graph shared by the others, and the head
(the two-layer lowering's work); in fp8 each layer's graph carries its own scales and is compiled on its own, and
carries the quantize and dequantize nodes Intel Neural Compressor adds (``fp8.py``). The surrogates are least
squares over features of the shape (prefill: 1, batch, tokens, batch·length²; decode: 1, batch, KV tokens),
non-negative; their largest relative error on held-out shapes is reported with the plan. A prompt bucket with
context blocks (prefix caching, chunked prefill) is valued with its attention term over query × (query + context)
and its other terms over the query alone (``bucket_value``): the prefill steps are lowered without a context.
A decode bucket's activations are those of vLLM-Gaudi's flat paged attention where they grow with the KV blocks
referenced: one layer's keys and values gathered for every referenced token (the lowered step's own attention,
transformers' with its grouped-query copies, would count them more than once); the rest is the surrogate's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...lowering.values import nbytes
from ..capacity import CapacityError, LayeredStep, card_steps, step_graphs
from ...modelfiles.modelspec import ModelSpec
from . import fp8

QUANTITIES = ("time_s", "activation_bytes", "slices", "nodes")
SLICE_BYTES = 1 << 20  # the graph compiler's unit of work: a TPC's double-buffered share of Gaudi 2's 48 MB SRAM


@dataclass
class Surrogate:
    """``value(shape)`` = Σ coef · feature(shape), fitted on measured shapes."""

    features: Callable[[int, int], list[float]]
    coef: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, float] = field(default_factory=dict)  # largest relative error on held-out shapes

    def fit(self, shapes: list[tuple[int, int]], rows: list[dict[str, float]]) -> None:
        x = np.array([self.features(*s) for s in shapes], dtype=float)
        for q in QUANTITIES:
            self.coef[q] = _nonneg_lstsq(x, np.array([r[q] for r in rows], dtype=float))

    def check(self, shapes: list[tuple[int, int]], rows: list[dict[str, float]]) -> None:
        for q in QUANTITIES:
            errs = [abs(self(q, *s) / r[q] - 1) for s, r in zip(shapes, rows) if r[q]]
            self.error[q] = max(errs, default=0.0)

    def __call__(self, quantity: str, a: int, b: int) -> float:
        return float(np.dot(self.coef[quantity], self.features(a, b)))


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient ≥ 0 (a term that would go negative is dropped and the rest refit)."""
    keep = list(range(x.shape[1]))
    while keep:
        scale = np.abs(x[:, keep]).max(axis=0)
        scale[scale == 0] = 1
        sol = np.linalg.lstsq(x[:, keep] / scale, y, rcond=None)[0] / scale
        if (sol >= 0).all():
            coef = np.zeros(x.shape[1])
            coef[keep] = sol
            return coef
        keep.pop(int(np.argmin(sol)))
    return np.zeros(x.shape[1])


def prefill_features(batch: int, length: int) -> list[float]:
    return [1.0, batch, batch * length, batch * length * length]


def decode_features(batch: int, kv_tokens: int) -> list[float]:
    return [1.0, batch, kv_tokens]


@dataclass
class ServingModel:
    """One card's prefill and decode steps, their weights and KV bytes per token, and surrogates over them."""

    name: str
    target: str
    dtype: str
    cards: int
    prefill: Any
    decode: Any
    weights_bytes: int = 0
    kv_bytes_per_token: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    surrogates: dict[str, Surrogate] = field(default_factory=dict)
    measured: int = 0
    runtime_scale_patching: bool = False  # RUNTIME_SCALE_PATCHING=1: fp8 scales are inputs, layers share graphs

    @property
    def sram_bytes(self) -> int:
        return SLICE_BYTES

    def measure(self, phase: str, batch: int, length: int) -> dict[str, float]:
        """Exact time, activations, compile slices, weights and input bytes at one shape (length: prompt tokens,
        or each sequence's KV tokens)."""
        step = self.prefill if phase == "prompt" else self.decode
        point = {"batch": batch, "input_len" if phase == "prompt" else "kv_len": length}
        self.measured += 1
        if isinstance(step, LayeredStep):
            a, b = _measure_graph(step.one, point, self.sram_bytes), _measure_graph(step.two, point, self.sram_bytes)
            out = {k: a[k] + (step.groups - 1) * (b[k] - a[k]) for k in a}
            out["activation_bytes"] = b["activation_bytes"]  # the arena does not grow with depth
            if fp8.layers_share_graphs(self.dtype, self.runtime_scale_patching):  # the first layer's and one more
                out["slices"] = b["slices"]
            return out
        return _measure_graph(step, point, self.sram_bytes)

    def fit(self, prompt_extent: tuple[int, int], decode_extent: tuple[int, int], block_size: int) -> None:
        """Fit both surrogates over shapes spanning (largest batch, largest length or KV tokens)."""
        bs, seq = prompt_extent
        shapes = _design(bs, max(seq, 2 * block_size), block_size)
        self.surrogates["prompt"] = self._fit("prompt", prefill_features, shapes, lambda b, s: s)
        bs, kv = decode_extent
        shapes = [(b, max(k, b)) for b, k in _design(bs, max(kv, 2 * block_size), block_size)]
        self.surrogates["decode"] = self._fit("decode", decode_features, shapes, lambda b, k: max(1, k // b))

    def _fit(self, phase: str, features, shapes, length: Callable[[int, int], int]) -> Surrogate:
        rows = [self.measure(phase, b, length(b, x)) for b, x in shapes]
        model = Surrogate(features)
        model.fit(shapes[:-2], rows[:-2])
        model.check(shapes[-2:], rows[-2:])
        model.fit(shapes, rows)  # the reported error is the held-out one; the final fit uses every shape
        return model

    @property
    def layers(self) -> int | None:
        """Decoder layers of a step lowered per layer (None when the model file gives a whole step)."""
        return self.prefill.layers if isinstance(self.prefill, LayeredStep) else None

    def value(self, phase: str, quantity: str, batch: int, x: int) -> float:
        """A surrogate's value at a bucket: x is the prompt length, or the decode bucket's KV tokens."""
        return max(0.0, self.surrogates[phase](quantity, batch, x))

    def bucket_value(self, phase: str, quantity: str, bucket: tuple[int, int, int], block_size: int) -> float:
        """A surrogate's value at a vLLM-Gaudi bucket: prompt (batch, query, context blocks), decode (batch, 1,
        blocks)."""
        batch, query, blocks = bucket
        if phase == "decode" and quantity == "activation_bytes" and self.layers:
            coef = self.surrogates["decode"].coef[quantity]  # (1, batch, KV tokens): the KV term replaced
            gathered = blocks * block_size * self.kv_bytes_per_token / self.layers
            return max(0.0, float(coef[0] + coef[1] * batch)) + gathered
        if phase == "decode":
            return self.value("decode", quantity, batch, blocks * block_size)
        coef = self.surrogates["prompt"].coef[quantity]
        context = blocks * block_size
        return max(0.0, float(np.dot(coef, [1.0, batch, batch * query, batch * query * (query + context)])))


def _design(batch: int, length: int, block: int) -> list[tuple[int, int]]:
    """Shapes spanning (1..batch) × (block..length), the last two held out to check the fit."""
    mid_b, mid_l = max(1, batch // 2), max(block, length // 2)
    grid = [(1, block), (1, length), (batch, block), (batch, length), (mid_b, mid_l), (1, mid_l), (batch, mid_l)]
    held = [(max(1, batch // 4), max(block, length // 3)), (max(1, 3 * batch // 4), max(block, 3 * length // 4))]
    return list(dict.fromkeys(grid)) + held


def _measure_graph(step, point: dict[str, int], sram: int) -> dict[str, float]:
    recipe = step.at(point)
    env, memory = recipe.facts["plan_at"], recipe.facts["memory"]
    outputs = fp8.compiled_outputs(recipe, step.params, env)  # with the quantize nodes of an fp8 graph
    weights = sum(nbytes(s, env) for s in recipe.inputs[:step.params])
    return {"time_s": recipe.facts["cost"]["total_s"], "activation_bytes": memory["arena_bytes"],
            "slices": sum(max(1, math.ceil(b / sram)) for b in outputs), "nodes": len(outputs),
            "weights_bytes": weights, "input_bytes": memory["input_bytes"], "ops": len(recipe.nodes)}


def load(spec: ModelSpec, target: str, dtype: str, cards: int, runtime_scale_patching: bool = False
         ) -> ServingModel:
    """Lower the model's steps for one card of ``cards`` (one- and two-layer shards when it has LAYERS)."""
    if spec.per_card is not None:
        prefill, decode = card_steps(spec, target, dtype, cards)
    elif cards == 1:
        prefill, decode = step_graphs(spec, target, dtype)
    else:
        raise CapacityError(f"{spec.path}: planning across cards needs PER_CARD(cards, group, layers) in the "
                            "model file, or a Hugging Face config.json")
    model = ServingModel(spec.name, target, dtype, cards, prefill, decode,
                         runtime_scale_patching=runtime_scale_patching)
    a, b = model.measure("decode", 1, 64), model.measure("decode", 1, 128)
    model.weights_bytes = round(a["weights_bytes"])
    model.kv_bytes_per_token = (b["input_bytes"] - a["input_bytes"]) / 64
    model.ops = {"prompt": round(model.measure("prompt", 1, 64)["ops"]), "decode": round(a["ops"])}
    return model


__all__ = ["ServingModel", "Surrogate", "load", "decode_features", "prefill_features"]
