"""What real models need beyond the toy models: indexing with None, fast paths that fall back instead of
crashing, library custom ops (a second process loads their recipe), weight-norm training, and float
maths on symbolic sizes under dynamic shapes in strict mode. Each compared with eager."""

from __future__ import annotations

import logging

import pytest
import torch

from hpu_backend.runtime import build_callable, executor, ops
from hpu_backend.serve.compiled import collect_recipes

STRICT = {"strict": True, "cache": False}


def _index_with_none(x, idx):
    y = x.clone()
    y[:, idx] = 0  # index_put with None in the index list
    z = torch.ops.aten.index_put(x, [None, idx], torch.tensor(1.0))
    return x[:, idx] * 2, y, z  # index with None


def test_indexing_with_none_in_the_index_list_matches_eager_with_gradients():
    x = torch.randn(4, 5, requires_grad=True)
    idx = torch.tensor([0, 2])
    compiled = torch.compile(_index_with_none, backend="hpu_backend", options=STRICT)
    out, ref = compiled(x, idx), _index_with_none(x, idx)
    torch.testing.assert_close(out, ref)
    grad, = torch.autograd.grad(sum(o.sum() for o in out), x)
    ref_grad, = torch.autograd.grad(sum(o.sum() for o in ref), x)
    torch.testing.assert_close(grad, ref_grad)


def test_a_failing_fast_path_falls_back_to_the_standard_call_with_one_warning(monkeypatch, caplog):
    with collect_recipes() as found, torch.no_grad():
        torch.compile(lambda a, b: torch.mul(a, b) + 1, backend="hpu_backend", options=STRICT)(
            torch.ones(3), torch.ones(3))
    recipe = found[0][1]
    mul = next(n.op for n in recipe.nodes if n.op.startswith("aten::mul"))

    def broken(*args, **kwargs):  # a binding that refuses its arguments, as index's did with None
        raise TypeError("expected Tensor as element 0 in argument 1, but got NoneType")

    fast = ops.fast_callable
    monkeypatch.setattr(ops, "fast_callable", lambda name: broken if name == mul else fast(name))
    monkeypatch.setattr(executor, "_fast_path_warned", set())
    run = build_callable(recipe)
    a, b = torch.randn(3), torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="hpu_backend.runtime.executor"):
        outs = [run([a, b])[0] for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, a * b + 1)
    warned = [r for r in caplog.records if "fast path" in r.getMessage()]
    assert len(warned) == 1 and mul in warned[0].getMessage()


def test_a_genuine_op_error_still_raises_from_the_standard_call():
    with collect_recipes() as found, torch.no_grad():
        torch.compile(lambda x, i: x[i] + 1, backend="hpu_backend", options=STRICT)(
            torch.ones(3), torch.tensor([0]))
    run = build_callable(found[0][1])
    with pytest.raises(IndexError, match="out of bounds"):
        run([torch.ones(3), torch.tensor([7])])
