"""A fast sample of the key fuzzer (bench/key_fuzz.py): one mutation of every kind, no wrong hit, no result unlike
eager, and needless misses only of the kinds the fuzzer names as by design; and the fuzzer itself catches a
key made too weak."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def fuzzer():
    spec = importlib.util.spec_from_file_location("hpu_bench_key_fuzz", ROOT / "bench" / "key_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GROUPS = ("graph.", "inputs.", ("state.", "target", "settings", "toolchain."))


@pytest.mark.parametrize("prefix", GROUPS, ids=["graph", "inputs", "state-settings-toolchain"])
def test_one_mutation_of_every_kind_hits_only_what_it_may(fuzzer, prefix, tmp_path):
    kinds = [k for k in fuzzer.MUTATORS if k.startswith(prefix)]
    verdicts = fuzzer.fuzz(len(kinds), seed=7, kinds=kinds, workdir=tmp_path)
    assert [v.kind for v in verdicts] == kinds
    assert [v for v in verdicts if v.wrong_hits] == []
    assert [v for v in verdicts if v.mismatch] == []
    assert [v for v in verdicts if v.needless and v.kind not in fuzzer.BY_DESIGN] == []
    # Each mutation that changed what is built missed; each that changed nothing hit.
    for v in verdicts:
        assert v.served_hit != v.changed or v.kind in fuzzer.BY_DESIGN, v


def test_the_fuzzer_finds_a_wrong_hit_when_the_key_ignores_a_custom_ops_backward(fuzzer, tmp_path, monkeypatch):
    from hpu_backend.serve import keys

    monkeypatch.setattr(keys, "_custom_op_formulas", lambda op: None)  # the key as it was: the op's name only
    verdicts = fuzzer.fuzz(2, seed=3, kinds=["graph.custom_backward"], workdir=tmp_path)
    assert all(v.wrong_hits == ["program"] and v.served_hit for v in verdicts), verdicts


def test_a_needless_miss_is_found_when_the_key_holds_what_the_recipe_ignores(fuzzer, tmp_path, monkeypatch):
    from hpu_backend.serve import keys

    monkeypatch.setattr(keys, "settings_fields", lambda settings, symbolic: dict(settings.key_fields(),
                                                                                 model=settings.model))
    custom, warm = _warm(fuzzer, tmp_path)
    labelled = fuzzer.replace(fuzzer.Case(), options=(("model", "another"),))  # a label, stored with entries
    verdict = fuzzer.trial(fuzzer.Case(), "settings", "model", labelled, custom, warm, tmp_path)
    assert not verdict.changed and sorted(verdict.needless) == ["program", "recipe"], verdict


def _warm(fuzzer, tmp_path):
    import hpu_backend.device as device

    device.enable("eager")
    custom = fuzzer.CustomOp(f"keyfuzz_test_{id(tmp_path)}")
    fuzzer.run_compiled(fuzzer.Case(), custom, tmp_path / "warm")
    return custom, tmp_path / "warm"
