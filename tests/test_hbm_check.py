"""A plan that exceeds HBM is one warning at compile time (an error in strict mode), naming the peak, the
largest buffers with their source lines, and the docs' remedies; compile-only runs stay quiet."""

import logging

import pytest
import torch

from hpu_backend.lowering import LoweringError


def _outer(x):
    return (x @ x.t()).sum()  # an n×n buffer: at n = 2^20 (the bucket's upper end) it is 4 TiB


OPTIONS = {"cache": False, "buckets": "list:4,1048576"}


def _compiled(**extra):
    torch._dynamo.reset()
    return torch.compile(_outer, backend="hpu_backend", dynamic=True, options={**OPTIONS, **extra})


def test_overflow_warns_once_with_peak_buffers_and_remedies(caplog):
    f = _compiled()
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for n in (6, 7, 9):
            x = torch.randn(n, 3)
            torch.testing.assert_close(f(x), _outer(x))
    found = [m for m in caplog.messages if "exceeds gaudi2's 96.00 GiB" in m]
    assert len(found) == 1
    assert "largest buffers: " in found[0] and "test_hbm_check.py:" in found[0]
    assert "mark_step" in found[0] and "smaller batch" in found[0]


def test_overflow_is_an_error_in_strict_mode():
    f = _compiled(strict=True)
    with pytest.raises(Exception, match="exceeds gaudi2's") as e:
        f(torch.randn(6, 3))
    assert isinstance(e.value, LoweringError) or isinstance(e.value.__cause__, LoweringError)


def test_a_plan_that_fits_or_a_compile_only_run_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        _compiled(buckets="list:4,64")(torch.randn(6, 3))
        _compiled(execute=False)(torch.randn(6, 3))
    assert not [m for m in caplog.messages if "exceeds" in m]
