"""hpu_backend.analyze(): per-graph report of engines, fallbacks, clusters, fusions, estimates, graph breaks."""

from __future__ import annotations

import json

import pytest
import torch

import hpu_backend
from hpu_backend.diagnosis.report import AnalysisReport
from conftest import load_model_file


@pytest.mark.e2e
def test_analyze_gpt_reports_fusions_estimates_and_no_breaks():
    gpt = load_model_file("gpt")
    tokens, _ = gpt.make_inputs(2, 32)
    report = hpu_backend.analyze(gpt.make_model(), tokens, target="gaudi3", options={"cache": False})
    assert isinstance(report, AnalysisReport) and report.graph_breaks == 0
    (g,) = report.graphs
    assert g.kind == "inference" and g.fusions["fused_sdpa"] == 2 and g.clusters == 1
    assert g.ops_by_engine["mme"] > 0 and g.fallbacks == [] and g.est_time_s > 0 and g.est_peak_bytes > 0
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["target"] == "gaudi3" and doc["estimate"] is True and doc["graphs"][0]["name"] == g.name
    text = str(report)
    assert "est. time" in text and "est. peak HBM" in text and g.name in text


def test_analyze_reports_fallbacks_transfers_and_graph_breaks():
    def f(x):
        y = torch.special.digamma(x.bfloat16()).float() * 2
        print("graph break")  # Dynamo cannot trace print: two graphs
        return torch.relu(y) + 1

    report = hpu_backend.analyze(f, torch.rand(64) + 0.5, options={"cache": False})
    assert report.graph_breaks == 1 and report.break_reasons
    assert report.fallback_ops == {"aten::digamma": 1}
    (with_fallback,) = [g for g in report.graphs if g.fallbacks]
    assert with_fallback.host_transfers["count"] == 2 and with_fallback.est_transfer_s > 0
    assert "aten::digamma" in str(report)


def test_analyze_training_graphs():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    report = hpu_backend.analyze(model, torch.randn(8, 16), backward=True, options={"cache": False})
    assert sorted(g.kind for g in report.graphs) == ["backward", "forward"]
    assert report.est_time_s == sum(g.est_time_s for g in report.graphs) > 0
