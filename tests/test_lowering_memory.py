"""Memory plan: arena properties (hypothesis), O(1) buffers for chains, views and fusions not counted."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings, strategies as st

from hpu_backend.lowering import lower_bucket, lower_graph
from hpu_backend.lowering.arena import Buffer, assign_offsets, peak_live
from test_lowering_helpers import context, lower


def _check_plan(buffers: list[Buffer], offsets: dict[str, int], size: int) -> None:
    """At every step, the live buffers lie inside the arena and share no byte."""
    steps = {s for b in buffers for s in (b.first, b.last)}
    for step in steps:
        live = sorted((offsets[b.name], offsets[b.name] + b.size) for b in buffers if b.first <= step <= b.last)
        assert all(0 <= lo and hi <= size for lo, hi in live)
        assert all(a_hi <= b_lo for (_, a_hi), (b_lo, _) in zip(live, live[1:]))


buffer_lists = st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 30), st.integers(0, 10)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(buffer_lists)
def test_arena_covers_every_live_set_and_is_at_least_the_peak(items):
    buffers = [Buffer(f"b{i}", size, first, first + length) for i, (size, first, length) in enumerate(items)]
    offsets, size = assign_offsets(buffers)
    _check_plan(buffers, offsets, size)
    assert size >= peak_live(buffers)
    assert size <= sum(b.size for b in buffers)


def _chain(n):
    def f(x):
        for i in range(n):
            x = torch.sin(x) if i % 2 else x * 1.5
        return x
    return f


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 24))
def test_a_chain_of_n_elementwise_ops_needs_o1_buffers(n):
    size = 64 * 64 * 4
    unfused = lower(_chain(n), torch.randn(64, 64), fusion=False).facts["memory"]
    assert len(unfused["buffers"]) == n - 1  # every intermediate gets a buffer ...
    assert unfused["arena_bytes"] <= 2 * size  # ... but two slots suffice, whatever n is
    assert unfused["peak_bytes"] == unfused["persistent_bytes"] + unfused["arena_bytes"]
    fused = lower(_chain(n), torch.randn(64, 64)).facts["memory"]
    assert fused["arena_bytes"] == 0 and fused["on_chip_bytes"] == (n - 1) * size


def test_real_plan_of_a_model_graph_covers_its_live_sets():
    def mlp(x, w1, w2):
        h = torch.relu(x @ w1)
        return torch.softmax(h @ w2, -1).sum(0)

    mem = lower(mlp, torch.randn(32, 16), torch.randn(16, 64), torch.randn(64, 8), fusion=False).facts["memory"]
    buffers = [Buffer(*b[:1], b[2], b[3], b[4]) for b in mem["buffers"]]
    _check_plan(buffers, {b[0]: b[1] for b in mem["buffers"]}, mem["arena_bytes"])
    assert mem["arena_bytes"] >= mem["peak_live_bytes"] > 0


def test_views_and_aliases_are_not_counted_twice():
    plain = lower(lambda x: (x * 2) + 1, torch.randn(8, 8), fusion=False).facts["memory"]
    views = lower(lambda x: ((x * 2).view(64).view(8, 8).t().t()) + 1, torch.randn(8, 8), fusion=False)
    assert views.facts["memory"]["intermediate_bytes"] == plain["intermediate_bytes"] == 8 * 8 * 4
    assert views.facts["memory"]["persistent_bytes"] == plain["persistent_bytes"]


def test_outputs_and_inputs_are_persistent_and_real_dtypes_count():
    mem = lower(lambda x, w: (x @ w).relu(), torch.randn(4, 8, dtype=torch.bfloat16),
                torch.randn(8, 2, dtype=torch.bfloat16), fusion=False).facts["memory"]
    assert mem["input_bytes"] == (32 + 16) * 2 and mem["output_bytes"] == 8 * 2
    assert mem["intermediate_bytes"] == 8 * 2 and mem["fits_hbm"]


@functools.cache
def _symbolic_template():
    def f(x, w):
        h = torch.relu(x @ w)
        return h.softmax(-1) * 2, h.sum(0)
    captured, ctx = context(f, torch.randn(16, 8), torch.randn(8, 32), symbolic=True)
    return lower_graph(captured, ctx), ctx


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 512), st.integers(1, 64), st.integers(1, 256))
def test_plan_scales_with_the_bucket_and_stays_consistent(a, b, c):
    template, ctx = _symbolic_template()
    mem = lower_bucket(template, ctx.at(dict(zip(template.symbols, (a, b, c))))).facts["memory"]
    buffers = [Buffer(x[0], x[2], x[3], x[4]) for x in mem["buffers"]]
    _check_plan(buffers, {x[0]: x[1] for x in mem["buffers"]}, mem["arena_bytes"])
    assert mem["input_bytes"] == 4 * (a * b + b * c) and mem["arena_bytes"] >= mem["peak_live_bytes"]
