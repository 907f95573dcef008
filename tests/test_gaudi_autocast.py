"""hpu_backend.gaudi.autocast: Gaudi's bf16/fp32 op lists, eagerly and under torch.compile, against CPU autocast
(where the lists agree) and a manual cast (where they differ); the list files and their errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hpu_backend
from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.gaudi import autocast
from hpu_backend.gaudi.mixed_precision import FP32_OPS, LOWER_PRECISION_OPS, AutocastListError, callables_of, op_lists


def _compiled(fn):
    return torch.compile(fn, backend="hpu_backend", options={"cache": False})


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _step(model, context, run):
    """Output, loss and parameter gradients of one MSE step of ``model`` under ``context``."""
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    with context():
        out, loss = run(model, x, target)
    loss.backward()
    return [out, loss, *(p.grad for p in model.parameters())]


def _forward(model, x, target):
    out = model(x)
    return out, F.mse_loss(out, target)


def test_torch_autocast_for_hpu_is_accepted_and_casts_nothing_on_this_build():
    with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
        assert (torch.randn(4, 4) @ torch.randn(4, 4)).dtype == torch.float32
    with autocast():
        assert (torch.randn(4, 4) @ torch.randn(4, 4)).dtype == torch.bfloat16
    assert hpu_backend.autocast is autocast


def test_compiling_under_torch_autocast_for_hpu_warns_once(caplog, monkeypatch):
    import logging

    from hpu_backend import backend

    monkeypatch.setattr(backend, "_warned_autocast", [False])
    f = _compiled(lambda x: x @ x)
    x = torch.randn(4, 4)
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        f(x)  # outside the context: nothing to say
        assert not [m for m in caplog.messages if "casts nothing" in m]
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            torch.testing.assert_close(f(x), x @ x)
            f(torch.randn(5, 4).t() @ torch.randn(5, 4))
    assert len([m for m in caplog.messages if "casts nothing" in m and "gaudi.autocast()" in m]) == 1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_matches_cpu_autocast_where_the_lists_agree(tmp_path, compiled):
    # Ops both Gaudi's and CPU autocast's lists put in bf16 (linear, matmuls) or float32 (mse_loss).
    (tmp_path / "lower.txt").write_text("linear\naddmm\nmm\nmatmul\n")
    (tmp_path / "fp32.txt").write_text("mse_loss\n")
    env = {"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(tmp_path / "lower.txt"),
           "PT_HPU_AUTOCAST_FP32_OPS_LIST": str(tmp_path / "fp32.txt")}
    run = _compiled(_forward) if compiled else _forward
    ours = _step(_mlp(), lambda: autocast(env=env), run)
    cpu = _step(_mlp(), lambda: torch.autocast("cpu", dtype=torch.bfloat16), _forward)
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32
    for a, b in zip(ours, cpu):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def _mixed(x, w):
    """softmax (bf16 on Gaudi, float32 under CPU autocast), exp and division (float32 on Gaudi), mul (bf16)."""
    p = (x @ w).softmax(-1)
    return (p.exp() / 3.0) * x.sum(-1, keepdim=True)


def _mixed_by_hand(x, w):
    bf16, f32 = torch.bfloat16, torch.float32
    p = (x.to(bf16) @ w.to(bf16)).softmax(-1)
    q = p.to(f32).exp() / 3.0
    return q.to(bf16) * x.sum(-1, keepdim=True).to(bf16)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gaudis_default_lists_match_a_manual_cast(compiled):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(6, 8, generator=g), torch.randn(8, 8, generator=g)
    w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
    with autocast(env={}):
        got = (_compiled(_mixed) if compiled else _mixed)(x, w1)
    want = _mixed_by_hand(x, w2)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    got.float().sum().backward()
    want.float().sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad)


def test_each_recipe_node_records_the_dtype_it_produces():
    fn = _compiled(_mixed)
    with collect_recipes() as found, autocast(env={}), torch.no_grad():
        fn(torch.randn(6, 8), torch.randn(8, 8))
    ((_, recipe, _),) = found
    dtypes = {n.op.split("::")[1].split(".")[0]: n.out[0].dtype for n in recipe.nodes}
    assert dtypes["mm"] == dtypes["_softmax"] == dtypes["mul"] == "bfloat16"
    assert dtypes["exp"] == dtypes["div"] == dtypes["sum"] == "float32"
    assert "_to_copy" in dtypes  # the casts are ops of the recipe


def test_a_compiled_function_is_recompiled_outside_the_context():
    fn = _compiled(lambda x, w: x @ w)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(env={}):
        assert fn(x, w).dtype == torch.bfloat16
    assert fn(x, w).dtype == torch.float32
    torch.testing.assert_close(fn(x, w), x @ w)


def test_list_files_replace_the_defaults_and_optimum_names_work(tmp_path):
    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("mm\n\n  bmm  \n")
    fp32.write_text("softmax\nexp\n")
    assert op_lists({}) == (LOWER_PRECISION_OPS, FP32_OPS)
    assert op_lists({"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(lower)}) == (("mm", "bmm"), ())
    assert op_lists({"FP32_LIST": str(fp32)}) == ((), ("softmax", "exp"))
    assert op_lists({"LOWER_LIST": str(fp32), "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(lower)})[0] == (
        "mm", "bmm")
    with autocast(env={"LOWER_LIST": str(lower), "FP32_LIST": str(fp32)}):
        x = torch.randn(4, 4)
        assert (x @ x).dtype == torch.float32  # matmul is not on this list
        assert torch.mm(x, x).dtype == torch.bfloat16
        assert torch.mm(x, x).softmax(-1).dtype == torch.float32
    # An op on both lists runs in lower precision, as on Gaudi.
    with autocast(env={"LOWER_LIST": str(lower), "FP32_LIST": str(lower)}):
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize("content, message", [
    (None, r"PT_HPU_AUTOCAST_FP32_OPS_LIST=.*missing\.txt: cannot read the op list"),
    ("mm, bmm\n", r"line 1 'mm, bmm' is not an op name; write one op name per line"),
    ("exp\nnot_an_op_at_all\n", r"line 2: 'not_an_op_at_all' names no torch op"),
])
def test_a_missing_or_malformed_list_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "missing.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AutocastListError, match=message) as e:
        autocast(env={"PT_HPU_AUTOCAST_FP32_OPS_LIST": str(path)})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="dtype torch.float64 is not one of"):
        autocast(dtype=torch.float64)


def test_every_default_op_has_a_python_entry_point():
    assert [n for n in LOWER_PRECISION_OPS + FP32_OPS if not callables_of(n)] == []
    assert F.cross_entropy in callables_of("cross_entropy_loss")


@pytest.mark.e2e
def test_a_gpt_training_step_under_autocast_matches_eager_autocast():
    from conftest import load_model_file

    spec = load_model_file("gpt")

    def step(compiled):
        model = spec.make_model().train()
        run = _compiled(model) if compiled else model
        inputs = spec.make_inputs(2, 16, seed=0)
        with autocast(env={}):
            out = run(*inputs[:spec.MODEL_INPUTS])
            loss = spec.loss(out, *inputs)
        loss.backward()
        return [out, loss, *(p.grad for p in model.parameters())]

    ours, eager = step(True), step(False)
    assert eager[0].dtype == torch.bfloat16 and eager[1].dtype == torch.float32
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a, b)
