"""Smaller things a new user tripped over: HPU-graph captures counted and their train-mode error, the effects
wrapper not taken for a CPU fallback, torch's profiler-range warning, eviction counts, a package's claimed sizes,
recipe inputs named as the model names them, and ``stats`` against a fleet tier with no local cache."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from cli_helpers import TINY, cli, cli_json, one_line, tiny_model
from hpu_backend import load_package, metrics
from hpu_backend.gaudi import wrap_in_hpu_graph


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x)).relu()


def test_hpu_graph_capture_of_a_train_mode_model_says_train_mode_and_runs_eagerly(caplog):
    model, eager = _Net().train(), _Net().train()
    x = torch.randn(5, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend.gaudi.graphs"):
        got = wrap_in_hpu_graph(model)(x)
        want = eager(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(model.bn.running_mean, eager.bn.running_mean)  # the eager run updated them
    (message,) = [r.getMessage() for r in caplog.records if "HPU graph capture" in r.getMessage()]
    assert "train mode" in message and "model.eval()" in message and "in eval mode" not in message, message


def test_hpu_graph_captures_count_in_graph_compilation():
    model = _Net().eval()
    wrapped = wrap_in_hpu_graph(_Net().eval())
    with torch.no_grad(), metrics.metric_localcontext("graph_compilation") as gc:
        for batch in (3, 3, 7):
            torch.testing.assert_close(wrapped(torch.ones(batch, 6)), model(torch.ones(batch, 6)))
    stats = dict(gc.stats())
    assert stats["TotalNumber"] == 2 and stats["Reasons"] == {"hpu graph capture": 2}, stats


def test_the_effects_wrapper_is_placed_as_the_op_it_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("PT_HPU_RECIPE_CACHE_CONFIG", f"{tmp_path}/c,true,0")  # lowered here, not read back
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.linalg.inv(x) + 1, backend="hpu_backend")
    x = torch.randn(3, 3) + 3 * torch.eye(3)
    with metrics.metric_localcontext("cpu_fallback") as fb:
        torch.testing.assert_close(fn(x), torch.linalg.inv(x) + 1)
    ops = dict(fb.stats())["FallbackOps"]
    assert ops and "higher_order::with_effects" not in ops and "aten::_linalg_check_errors" in ops, ops


def test_dynamos_profiler_range_warning_is_dropped_and_other_records_pass():
    import hpu_backend.backend  # noqa: F401  (installs the filter, as torch.compile's lookup of the backend does)

    def record(msg):
        return logging.LogRecord("torch._dynamo.variables.ctx_manager", logging.WARNING, "", 0, msg,
                                 (torch.autograd.profiler.record_function,), None)

    logger = logging.getLogger("torch._dynamo.variables.ctx_manager")
    assert not logger.filter(record("Profiler record function %s will be ignored"))
    assert logger.filter(record("something else about %s"))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """TINY warmed into a cache of its own (its inference graphs, one recipe per bucket)."""
    tmp = tmp_path_factory.mktemp("warmed")
    model = tiny_model(tmp)
    cli("warm", model, "-d", tmp / "cache")
    return model, tmp / "cache"


def test_show_names_inputs_as_the_model_does_on_the_hpu(warmed):
    _, cache = warmed
    key = next(r["key"] for r in cli_json("ls", "-d", cache) if r["kind"] == "inference")
    doc = cli_json("show", key, "-d", cache)
    names = [i["name"] for i in doc["inputs"]]
    assert {"0.weight", "0.bias", "2.weight", "2.bias", "args[0]"} <= set(names), names
    assert {i["device"] for i in doc["inputs"] if i["kind"] == "tensor"} == {"hpu"}
    assert "input_labels" not in cli("show", key, "-d", cache).output  # shown as names, not as a fact


def test_stats_counts_what_evict_removed(warmed, tmp_path):
    _, cache = warmed
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    before = cli_json("stats", "-d", copy)["evictions"]
    removed = cli_json("evict", "-d", copy, "--older-than", "0s", "--yes")["plan"]
    assert len(removed) >= 2
    assert cli_json("stats", "-d", copy)["evictions"] == before + len(removed)


def test_stats_with_a_fleet_tier_and_no_local_cache_checks_the_tier(tmp_path):
    line = one_line(cli("stats", "-d", tmp_path / "none", "--remote", "redis://127.0.0.1:1/0", code=1))
    assert line == "error: remote cache redis://127.0.0.1:1/0: server unreachable", line


@pytest.mark.e2e
def test_a_package_claims_only_the_sizes_it_serves(tmp_path):
    model_file = tiny_model(tmp_path)  # AXES batch 2 and 8, buckets exp:2: 1-2 and 5-8, nothing for 3 or 4
    cli("package", model_file, "-o", tmp_path / "t.hpkg", "--no-check")
    doc = cli_json("show", tmp_path / "t.hpkg")
    assert doc["serves"] == {"s0": [[1, 2], [5, 8]]}, doc["serves"]
    assert "serves     s0=1-2, 5-8" in cli("show", tmp_path / "t.hpkg").output
    namespace: dict = {}
    exec(TINY, namespace)
    model = namespace["make_model"]().eval()
    served = load_package(tmp_path / "t.hpkg", model)
    for batch in range(1, 10):
        x = torch.randn(batch, 8)
        claimed = any(a <= batch <= b for a, b in doc["serves"]["s0"])
        if claimed:
            torch.testing.assert_close(served(x), model(x))
        else:
            with pytest.raises(Exception, match="outside the packaged buckets"):
                served(x)
