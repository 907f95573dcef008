"""Placement, op table, partitioning and host transfers on small hand-built aten graphs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from hpu_backend.lowering import LoweringError
from hpu_backend.lowering.optable import default_table, is_host_op, packet_name
from hpu_backend.lowering.passes.find_transfers import find_transfers
from hpu_backend.lowering.passes.partition import partition
from hpu_backend.lowering.passes.place import place
from test_lowering_helpers import context, lower, node


def test_table_is_fresh_data_with_engines_per_op_family():
    a, b = default_table(), default_table()
    assert a is not b and a.records == b.records
    assert {a.lookup(op).engine for op in ("mm", "bmm", "addmm", "baddbmm", "convolution")} == {"mme"}
    assert a.lookup("aten::_scaled_dot_product_flash_attention_for_cpu.default").engine == "mme"
    assert {a.lookup(op).engine for op in ("add", "sum", "native_layer_norm", "_softmax", "gather")} == {"tpc"}
    assert a.lookup("view").engine == "view" and a.lookup("cat").engine == "dma"
    assert a.capable("aten::mm.default", ["float8_e4m3fn"]) and not a.capable("add", ["float8_e4m3fn"])
    assert a.capable("add", ["int32", "bool"]) and not a.capable("add", ["float64"])
    assert a.lookup("definitely_not_an_op") is None


@settings(max_examples=60, deadline=None)
@given(op=st.one_of(st.text(max_size=20), st.sampled_from(["add", "aten::digamma.default", "mm"])),
       dtypes=st.one_of(st.none(), st.integers(), st.text(max_size=8),
                        st.lists(st.one_of(st.text(max_size=8), st.none(), st.integers()), max_size=4)))
def test_capability_check_never_raises(op, dtypes):
    assert default_table().capable(op, dtypes) in (True, False)


def test_table_variants_are_new_tables():
    base = default_table()
    smaller = base.without("relu")
    wider = base.replace("digamma", dtypes=frozenset({"float32", "bfloat16"}))
    assert base.lookup("relu") is not None and smaller.lookup("relu") is None
    assert wider.capable("digamma", ["bfloat16"]) and not base.capable("digamma", ["bfloat16"])


def test_host_ops_and_packet_names():
    assert is_host_op("operator::mul") and is_host_op("aten::sym_size.int") and not is_host_op("aten::add.Tensor")
    assert packet_name("aten::add.Tensor") == "add" and packet_name("add") == "add"


def test_engines_after_placement():
    r = lower(lambda x, w: torch.relu(x @ w).view(-1), torch.randn(4, 8), torch.randn(8, 3))
    assert [(n.op, n.placement, n.engine) for n in r.nodes] == [
        ("aten::mm.default", "hpu", "mme"), ("aten::relu.default", "hpu", "tpc"),
        ("aten::view.default", "hpu", "view")]
    assert r.facts["placement"] == {"fallbacks": [], "engines": {"mme": 1, "tpc": 1, "view": 1}}


def test_unsupported_dtype_falls_back_with_the_bridge_line():
    r = lower(lambda x: torch.special.digamma(x), torch.randn(4, dtype=torch.bfloat16))
    (fb,) = r.facts["placement"]["fallbacks"]
    assert fb["op"] == "aten::digamma" and fb["dtypes"] == ["bfloat16"]
    assert fb["line"] == "CPU fallback digamma : self=HPUBFloat16Type"
    assert node(r, "digamma").placement == "cpu"
    assert lower(lambda x: torch.special.digamma(x), torch.randn(4)).facts["placement"]["fallbacks"] == []


def test_float64_and_ops_outside_the_table_fall_back():
    r = lower(lambda x: x + 1, torch.randn(3, dtype=torch.float64))
    assert [f["op"] for f in r.facts["placement"]["fallbacks"]] == ["aten::add"]
    captured, ctx = context(lambda x: torch.relu(x) + 1, torch.randn(3))
    r = place(captured, ctx, table=default_table().without("relu"))
    assert [(n.op, n.placement) for n in r.nodes] == [("aten::relu.default", "cpu"), ("aten::add.Tensor", "hpu")]
    assert "not supported" in r.facts["placement"]["fallbacks"][0]["reason"]


@pytest.mark.parametrize("name", ["add", "aten::add", "aten::add.Tensor"])
def test_place_on_cpu_allow_list(name):
    r = lower(lambda x: (x + 1).relu(), torch.randn(3), place_on_cpu=[name])
    assert [n.placement for n in r.nodes] == ["cpu", "hpu"]
    assert "PT_HPU_PLACE_ON_CPU" in r.facts["placement"]["fallbacks"][0]["reason"]


def test_strict_mode_turns_a_fallback_into_an_error_naming_op_and_dtype():
    with pytest.raises(LoweringError, match=r"aten::digamma \(bfloat16\)") as e:
        lower(lambda x: torch.special.digamma(x) * 2, torch.randn(4, dtype=torch.bfloat16), strict=True)
    assert e.value.pass_name == "place" and "digamma" in str(e.value)


def test_symbolic_int_ops_are_host_ops_not_fallbacks():
    r = lower(lambda x: x.reshape(x.shape[0] * x.shape[1]) * 2, torch.randn(4, 6), symbolic=True)
    host = [n for n in r.nodes if n.engine == "host"]
    assert host and all(n.placement == "hpu" for n in host)
    assert r.facts["placement"]["fallbacks"] == []


def test_a_fallback_splits_clusters_and_causes_two_transfers():
    def f(x):
        y = torch.relu(x) * 2
        z = torch.special.digamma(y.bfloat16())
        return z.float() + 1

    r = lower(f, torch.randn(16, 8))
    clusters = {n.name: n.cluster for n in r.nodes}
    assert clusters["digamma"] == -1 and clusters["relu"] != clusters["add"]
    assert r.facts["clusters"]["count"] == 2
    assert r.facts["transfers"] == [{"value": "_to_copy", "to": "cpu"}, {"value": "digamma", "to": "hpu"}]
    moved = r.facts["host_transfers"]
    assert moved["count"] == 2 and moved["bytes"] == 2 * 16 * 8 * 2  # bf16 both ways


def test_independent_fallback_does_not_split_a_cluster():
    def f(x, y):
        a = torch.relu(x) * 2
        b = torch.special.digamma(y)  # float64: not on the HPU, but nothing on the HPU depends on it
        return a + 1, b

    r = lower(f, torch.randn(4), torch.randn(4, dtype=torch.float64))
    hpu = {n.cluster for n in r.nodes if n.placement == "hpu"}
    assert hpu == {0} and r.facts["transfers"] == [{"value": "arg1_1", "to": "cpu"}, {"value": "digamma", "to": "hpu"}]


def test_partition_works_from_recipe_data_alone_and_keeps_clusters_acyclic():
    def f(x):
        a = torch.relu(x)
        b = torch.special.digamma(a.bfloat16())  # CPU
        c = a * 2  # independent of the fallback: stays in the first cluster
        return b.float() + c

    captured, ctx = context(f, torch.randn(8))
    placed = place(captured, ctx)
    r = partition(placed, ctx.for_bucket({}))  # a recipe without its FX graph partitions the same way
    cluster = {n.name: n.cluster for n in r.nodes}
    assert cluster["relu"] == cluster["mul"] == 0 and cluster["add"] == 1 and cluster["digamma"] == -1
    assert r.facts["clusters"] == {"count": 2, "sizes": [3, 2]}
    order = {n.name: i for i, n in enumerate(r.nodes)}
    for n in r.nodes:  # no edge goes from a later cluster back to an earlier one
        for ref in (x["r"] for x in n.args if isinstance(x, dict)):
            if ref in cluster and cluster[ref] >= 0 and n.cluster >= 0:
                assert cluster[ref] <= n.cluster, (ref, n.name, order[ref])
    assert find_transfers(r, ctx).facts["transfers"] == [{"value": "_to_copy", "to": "cpu"},
                                                         {"value": "digamma", "to": "hpu"}]
