"""Recompiles explained: the failed guard, its class, the value that broke it and the user's line
(hpu_backend/serve/recompiles.py), counted in the metrics, with the excessive-recompile and loop-constant
warnings once each."""

import logging
import sys

import pytest
import torch

from hpu_backend import metrics
from hpu_backend.serve import recompiles
from hpu_backend.serve.recompiles import classify

OPTIONS = {"cache": False}


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    recompiles.TRACKER = recompiles.Tracker()
    yield
    torch._dynamo.reset()


def _new(seen):
    return metrics.recompiles()[seen:]


STEPS = [0.1 * i for i in range(10)]


def sampler(x, i):
    return x * STEPS[i]  # the loop-constant pattern: a Python index into a list


def test_loop_constant_names_the_line_the_values_and_the_fix(caplog):
    f = torch.compile(sampler, backend="hpu_backend", options=OPTIONS)
    x = torch.randn(4)
    seen = len(metrics.recompiles())
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for i in range(4):
            torch.testing.assert_close(f(x, i), sampler(x, i))
    recs = _new(seen)
    assert [r["cause"] for r in recs] == ["constant"] * 3
    assert [r["change"] for r in recs] == ["0 -> 1", "1 -> 2", "2 -> 3"]
    line = sampler.__code__.co_firstlineno + 1
    assert {r["source"] for r in recs} == {f"test_recompiles.py:{line}"}
    loop = [m for m in caplog.messages if "loop constant pattern" in m]
    assert len(loop) == 1 and "torch.tensor(steps)" in loop[0] and f"test_recompiles.py:{line}" in loop[0]


def test_shape_dtype_and_grad_recompiles_are_classified():
    f = torch.compile(lambda x: x * 2, backend="hpu_backend", options={**OPTIONS})
    seen = len(metrics.recompiles())
    f(torch.randn(4))
    f(torch.randn(8))
    f(torch.randn(8, dtype=torch.float64))
    g = torch.compile(lambda x: x * 3, backend="hpu_backend", options={**OPTIONS})
    g(torch.randn(8))
    g(torch.randn(8, requires_grad=True))
    recs = _new(seen)
    assert [r["cause"] for r in recs] == ["input shape", "dtype", "requires_grad"]
    assert recs[0]["variable"] == "x" and recs[0]["change"] == "dim 0: 4 -> 8"
    assert recs[1]["change"] == "Float -> Double"
    causes = dict(metrics.metric_global("graph_compilation").stats())["RecompileCauses"]
    assert causes["input shape"] >= 1 and causes["dtype"] >= 1


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 2

    def forward(self, x):
        return x * self.k


def test_module_attribute_and_excessive_recompile_warning_once(caplog):
    m = Scaled()
    cm = torch.compile(m, backend="hpu_backend", options={**OPTIONS, "recompile_warn": 2})
    x = torch.randn(3)
    seen = len(metrics.recompiles())
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for k in range(2, 7):
            m.k = k
            torch.testing.assert_close(cm(x), x * k)
    recs = _new(seen)
    assert recs and all(r["cause"] == "module attribute" for r in recs)
    assert recs[0]["variable"].endswith(".k") and recs[0]["change"] == "2 -> 3"
    excessive = [m for m in caplog.messages if "recompiled" in m and "times" in m]
    assert len(excessive) == 1 and "module attribute: 3" in excessive[0]


def test_unreadable_reason_is_no_reason_not_an_error(monkeypatch):
    def drifted():  # a torch whose compile metrics lost the field
        raise AttributeError("'MetricsContext' object has no attribute '_metrics'")

    monkeypatch.setattr(recompiles, "_dynamo_state", drifted)
    assert recompiles.explain() is None
    f = torch.compile(lambda x: x + 1, backend="hpu_backend", options=OPTIONS)
    f(torch.randn(2))
    seen = len(metrics.recompiles())
    x = torch.randn(2, dtype=torch.float64)
    torch.testing.assert_close(f(x), x + 1)
    assert _new(seen) == []


def test_classify_reads_no_code_from_the_guard():
    code = sampler.__code__
    rec = classify("0/0: __import__('os').system('true') == 1", code, {"i": 3})
    assert rec.cause == "other" and rec.change == ""
    rec = classify("0/1: i == 1  # return x * STEPS[i]", code, {"i": 2})
    assert (rec.cause, rec.variable, rec.change) == ("constant", "i", "1 -> 2")


def test_a_size_range_guard_is_an_input_shape_with_its_range_and_value():
    """``2 <= x.size()[0] <= 15``: Dynamo's 0/1 specialization and torch's convolution kernel choice by batch;
    a batch of 16 breaks it. Read from the frame's locals, never evaluated."""
    code = sampler.__code__
    rec = classify("0/0: 2 <= x.size()[0] <= 15  # return F.conv2d(  # nn/modules/conv.py:560", code,
                   {"x": torch.randn(16, 3)})
    assert (rec.cause, rec.variable, rec.change) == ("input shape", "x", "dim 0: 2..15 -> 16")
    assert rec.source == f"test_recompiles.py:{code.co_firstlineno + 1}"  # the line that reads x
    rec = classify("0/0: 2 <= L['args'][1].size()[1]", code, {"args": (0, torch.randn(2, 1))})
    assert (rec.cause, rec.variable, rec.change) == ("input shape", "L['args'][1]", "dim 1: 2.. -> 1")
    assert classify("0/0: 2 <= y.size()[0] <= 15", code, {}).change == "dim 0: 2..15 -> ?"


def test_a_second_module_is_a_new_graph_not_a_recompile():
    # torch.compile calls every module through one Dynamo wrapper frame: the second module fails the first one's
    # guards there (the function mode stack, the wrapped callable, the backend), no recompile of the user's code
    from hpu_backend.gaudi import autocast

    first = torch.compile(torch.nn.Linear(8, 4), backend="hpu_backend", options=OPTIONS)
    second = torch.compile(Doubled(), backend="hpu_backend", options={**OPTIONS, "target": "gaudi3"})
    with autocast():
        first(torch.randn(2, 8))
    seen = len(metrics.recompiles())
    with metrics.metric_localcontext("graph_compilation") as gc:
        second(torch.randn(2, 8))
    assert dict(gc.stats())["Reasons"] == {"new graph": 1} and _new(seen) == []
    with metrics.metric_localcontext("graph_compilation") as gc:
        second(torch.randn(3, 8))  # a real recompile of that module is still one
    (rec,) = _new(seen)  # named by the module's own forward, not by Dynamo's wrapper
    assert dict(gc.stats())["Reasons"] == {"guard failure": 1} and rec["cause"] == "input shape"
    assert rec["function"].startswith("forward (test_recompiles.py:") and rec["library"] == ""


class Doubled(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_a_recompile_inside_library_code_is_named_at_the_users_line():
    """A user saw recompile causes at ``_pytree.py`` and the simulator's ``dispatch.py`` as if those were their lines:
    the user's line is the innermost of their own frames, in Dynamo's stack or, failing that, on the stack now."""
    import hpu_backend.device.dispatch as dispatch
    import torch.utils._pytree as pytree_module

    library = pytree_module.tree_flatten.__code__
    here = sampler.__code__
    stack = (f'0/1: i == 1\n  File "{here.co_filename}", line {here.co_firstlineno + 1}, in sampler\n'
             f'  File "{library.co_filename}", line {library.co_firstlineno}, in tree_flatten\n'
             f'  File "{dispatch.__file__}", line 90, in _call')
    rec = classify(stack, library, {"i": 2})
    assert rec.source == f"test_recompiles.py:{here.co_firstlineno + 1}" and rec.library.endswith("_pytree.py")
    line = sys._getframe().f_lineno + 1
    rec = classify(f'0/1: i == 1\n  File "{dispatch.__file__}", line 90, in _call', library, {"i": 2})
    assert rec.source == f"test_recompiles.py:{line}"  # no user frame in Dynamo's stack: this test's call
