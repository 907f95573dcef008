"""Cost estimate: monotone in every bucketed dimension (hypothesis), targets, fusion and fallbacks."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from hpu_backend.lowering import lower_bucket, lower_graph
from hpu_backend.targets import DEVICES, device
from test_lowering_helpers import context, lower


def _block(x, w1, w2, q, k, v):
    h = F.gelu(x @ w1) @ w2
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (h.softmax(-1) + 1).sum(), a


@functools.cache
def _template(fusion: bool):
    args = (torch.randn(32, 16), torch.randn(16, 64), torch.randn(64, 16),
            *(torch.randn(2, 4, 24, 8) for _ in range(3)))
    captured, ctx = context(_block, *args, symbolic=True, fusion=fusion)
    return lower_graph(captured, ctx), ctx


def _estimate(fusion: bool, values: dict) -> float:
    template, ctx = _template(fusion)
    return lower_bucket(template, ctx.at(values)).facts["cost"]["total_s"]


@settings(max_examples=40, deadline=None)
@given(st.data(), st.booleans())
def test_doubling_any_bucketed_dimension_never_lowers_the_estimate(data, fusion):
    symbols = _template(fusion)[0].symbols
    values = {s: data.draw(st.integers(1, 300), label=s) for s in symbols}
    dim = data.draw(st.sampled_from(symbols), label="doubled")
    assert _estimate(fusion, {**values, dim: 2 * values[dim]}) >= _estimate(fusion, values)


def test_estimate_is_labelled_and_per_cluster():
    cost = lower(lambda x, w: torch.relu(x @ w), torch.randn(256, 256), torch.randn(256, 256)).facts["cost"]
    assert cost["estimate"] is True and "estimate" in cost["note"] and cost["sources"]
    (cluster,) = cost["clusters"]
    assert cluster["mme_s"] > 0 and cluster["bound"] in ("mme", "tpc", "hbm")
    assert cost["total_s"] >= cluster["time_s"] == max(cluster["mme_s"], cluster["tpc_s"], cluster["hbm_s"]) + \
        device("gaudi2").launch_s


def test_gaudi3_is_estimated_faster_and_device_figures_cite_sources():
    args = (torch.randn(1024, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16))
    g2 = lower(torch.mm, *args).facts["cost"]
    g3 = lower(torch.mm, *args, target="gaudi3").facts["cost"]
    assert g3["target"] == "gaudi3" and g3["total_s"] < g2["total_s"]
    for spec in DEVICES.values():
        assert spec.sources and any("white paper" in s for s in spec.sources)
        assert spec.mme_peak("bfloat16") > spec.mme_peak("float32") and spec.hbm_bytes > 64 << 30


def test_bf16_matmul_is_estimated_faster_than_fp32():
    f32 = lower(torch.mm, torch.randn(2048, 2048), torch.randn(2048, 2048)).facts["cost"]["total_s"]
    b16 = lower(torch.mm, torch.randn(2048, 2048, dtype=torch.bfloat16),
                torch.randn(2048, 2048, dtype=torch.bfloat16)).facts["cost"]["total_s"]
    assert b16 < f32


def test_fallback_adds_cpu_and_transfer_time():
    x = torch.rand(256, 256) + 0.5
    on = lower(lambda t: torch.special.digamma(t) * 2, x).facts["cost"]
    off = lower(lambda t: torch.special.digamma(t) * 2, x, place_on_cpu=["digamma"]).facts["cost"]
    assert on["transfer_s"] == on["cpu_s"] == 0
    assert off["transfer_s"] > 0 and off["cpu_s"] > 0 and off["total_s"] > on["total_s"]


def test_device_rates_are_published_peaks_times_the_fitted_efficiency():
    args = (torch.randn(512, 512, dtype=torch.bfloat16), torch.randn(512, 512, dtype=torch.bfloat16))
    for target in ("gaudi2", "gaudi3"):
        cost, spec = lower(torch.mm, *args, target=target).facts["cost"], device(target)
        eff = spec.efficiency
        assert all(0 < f <= 1 for f in (eff.mme, eff.tpc, eff.hbm, eff.host)) and eff.sources
        assert cost["efficiency"] == {"mme": eff.mme, "tpc": eff.tpc, "hbm": eff.hbm, "host": eff.host}
        (cluster,) = cost["clusters"]
        assert cluster["hbm_s"] == pytest.approx(cluster["hbm_bytes"] / (spec.hbm_bytes_per_s * eff.hbm))
        assert cluster["mme_s"] == pytest.approx(cluster["flops"] / (spec.mme_peak("bfloat16") * eff.mme))
    assert device("gaudi2").efficiency is device("gaudi3").efficiency  # one set of factors for every target


def test_the_targets_settings_accept_are_the_devices_with_specs():
    from hpu_backend.targets import DEVICES
    from hpu_backend.settings import TARGETS

    assert list(TARGETS) == list(DEVICES)
