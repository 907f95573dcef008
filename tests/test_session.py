"""The compile session: settings, the store they ask for, the one bucket loop, and which session a compile uses."""

from __future__ import annotations

import logging

import pytest
import torch

from hpu_backend.lowering import LoweringError, lower_graph
from hpu_backend.serve.session import Session, session_for
from hpu_backend.settings import Settings
from test_lowering_helpers import context


def test_a_session_that_caches_nothing_holds_the_disabled_cache_not_none():
    for session in (Session(Settings.from_options({}, env={})),
                    Session.open(Settings.from_options({"cache": False}, env={}))):
        disk = session.store.disk
        assert disk is not None and not disk.enabled and session.store.config is None
        assert session.store.load("ab" * 8, lambda r: r) is None
        session.flush()  # nothing to wait for


def test_the_bucket_loop_lowers_one_recipe_per_bucket_under_the_settings_policies():
    captured, ctx = context(lambda x: torch.relu(x) * 2, torch.randn(6), symbolic=True, buckets="exp:4")
    template = lower_graph(captured, ctx)
    (sym,) = template.symbols
    session = Session(ctx.settings)
    buckets = session.buckets(template.symbols, [(3,), (4,), (5,), (9,)])
    assert buckets == [{sym: [0, 4]}, {sym: [0, 4]}, {sym: [5, 8]}, {sym: [9, 16]}]
    recipes = list(session.recipes(template, ctx, [buckets[0], buckets[2]]))
    assert [r.bucket for r in recipes] == [{sym: [0, 4]}, {sym: [5, 8]}]
    assert recipes[0].facts["memory"]["peak_bytes"] < recipes[1].facts["memory"]["peak_bytes"]


def test_a_compile_uses_the_session_in_use_when_it_holds_the_store_its_settings_ask_for(tmp_path):
    options = {"cache_config": f"{tmp_path / 'c'},false,64"}
    mine = Session.open(Settings.from_options(options, env={}))
    with mine.use():
        same = session_for(Settings.from_options({**options, "target": "gaudi3"}, env={}))
        other = session_for(Settings.from_options({"cache": False}, env={}))
    assert same.store is mine.store and same.runs is mine.runs and same.settings.target == "gaudi3"
    assert other.store is not mine.store and other.store.config is None
    assert session_for(Settings.from_options({"cache": False}, env={})).store is other.store  # the process's now
    mine.flush()


def test_the_graph_step_decides_strict_or_eager_after_a_lowering_failure(caplog):
    def fails():
        raise LoweringError("no kernel for aten.frobnicate", graph="fx_graph_0007")

    lenient, strict = (Session(Settings.from_options({"strict": s}, env={})) for s in (False, True))
    assert lenient.graph_step("fx_graph_0007", lambda: "lowered", lambda: "eager") == "lowered"
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        assert lenient.graph_step("fx_graph_0007", fails, lambda: "eager") == "eager"
    assert [r.getMessage() for r in caplog.records] == [
        "hpu_backend: could not lower fx_graph_0007, running it eagerly: no kernel for aten.frobnicate"]
    with pytest.raises(LoweringError, match="frobnicate"):
        strict.graph_step("fx_graph_0007", fails, lambda: "eager")
    with pytest.raises(LoweringError, match="frobnicate"):  # a graph with no eager form (a package's) raises
        lenient.graph_step("fx_graph_0007", fails, None)
