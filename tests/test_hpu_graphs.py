"""HPU Graphs (hpu_backend.gaudi.wrap_in_hpu_graph): a replay runs the captured recipe, not the module, and
matches eager exactly; captures per signature, bounded; falls back to eager where a replay cannot serve."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from hpu_backend.gaudi import wrap_in_hpu_graph
from hpu_backend.runtime import build_callable
from hpu_backend.runtime.peephole import fold_linear

from conftest import load_model_file


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


def test_replays_match_eager_exactly_and_do_not_run_the_module():
    model = _mlp()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model))
    calls = []
    graphed[0].register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        for seed in range(3):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(graphed(x), model(x), rtol=0, atol=0)
    captured = len(calls)  # the hook runs while the call is captured, never on a replay
    with torch.no_grad():
        graphed(torch.randn(4, 16))
    assert len(calls) == captured and len(graphed.forward.graphs) == 1
    graph = next(iter(graphed.forward.graphs.values()))
    assert "(x" not in graph.run.source and "p" in graph.run.source  # weights bound, not passed


def test_inputs_are_copied_into_static_buffers_and_parameters_updated_in_place_are_seen():
    model = _mlp()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model))
    x = torch.randn(2, 16)
    with torch.no_grad():
        graphed(x)
        graph = next(iter(graphed.forward.graphs.values()))
        y = torch.randn(2, 16)
        graphed(y)
        assert torch.equal(graph.static[0], y) and graph.static[0].data_ptr() != y.data_ptr()
        new = _mlp()
        for p in new.parameters():
            p.data.mul_(3)
        graphed.load_state_dict(new.state_dict())  # copies into the bound parameters
        torch.testing.assert_close(graphed(y), new(y), rtol=0, atol=0)


@pytest.mark.e2e
def test_gpt_replays_match_eager_at_each_length_and_max_graphs_bounds_the_captures():
    gpt = load_model_file("gpt")
    model = gpt.make_model().eval()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model), max_graphs=2)
    with torch.no_grad():
        for seq in (8, 16, 24, 8):
            (tokens,) = gpt.make_inputs(2, seq)[:1]
            torch.testing.assert_close(graphed(tokens), model(tokens), rtol=0, atol=0)
    assert graphed.forward.captures == 4  # 8, 16, 24, then 8 again: the oldest capture was dropped
    assert len(graphed.forward.graphs) == 2


def test_keyword_and_scalar_arguments_are_part_of_the_signature():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, *, scale: float = 1.0):
            return self.lin(x) * scale

    model = Scaled().eval()
    graphed = wrap_in_hpu_graph(copy.deepcopy(model))
    x = torch.randn(3, 4)
    with torch.no_grad():
        for scale in (2.0, 3.0, 2.0):
            torch.testing.assert_close(graphed(x, scale=scale), model(x, scale=scale), rtol=0, atol=0)
    assert len(graphed.forward.graphs) == 2


def test_train_and_eval_mode_are_separate_captures():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    graphed = wrap_in_hpu_graph(copy.deepcopy(model).train())
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert (graphed(x) == 0).any()  # dropout in training mode
        graphed.eval()
        torch.testing.assert_close(graphed(x), model.eval()(x), rtol=0, atol=0)
    assert len(graphed.forward.graphs) == 2


def test_grad_mode_runs_the_module_so_gradients_flow():
    model = _mlp().train()
    graphed = wrap_in_hpu_graph(model)
    x = torch.randn(2, 16)
    graphed(x).sum().backward()
    assert model[0].weight.grad is not None


def test_an_input_that_requires_grad_gets_its_gradient():
    model = _mlp().requires_grad_(False)
    graphed = wrap_in_hpu_graph(copy.deepcopy(model))
    x = torch.randn(2, 16, requires_grad=True)
    graphed(x.detach())  # captured without grad
    graphed(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_a_call_export_cannot_capture_runs_eagerly_after_one_warning(caplog):
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum().item() > 0 else x - 1

    graphed = wrap_in_hpu_graph(Branchy())
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        assert torch.equal(graphed(x), x * 2) and torch.equal(graphed(x), x * 2)
    assert sum("HPU graph capture" in r.message for r in caplog.records) == 1


def test_nd_linear_fold_is_bit_identical():
    """view → addmm(t(w)) → view over a contiguous 3-d input runs as one linear, with identical results."""
    from torch.export import export

    from hpu_backend.capture.exported import decompose, lower_exported
    from hpu_backend.lowering import lower_bucket
    from hpu_backend.settings import Settings

    lin = torch.nn.Linear(16, 8).eval()
    x = torch.randn(2, 5, 16)
    ep = decompose(export(lin, (x,), strict=False))
    template, ctx = lower_exported(ep, Settings.from_options({}), "nd")
    recipe = lower_bucket(template, ctx.for_bucket({}))
    assert [n.op for n in fold_linear(recipe)] == ["aten::linear.default"]
    from hpu_backend.runtime import executor

    plain = executor._Codegen(recipe)
    source = plain.render()
    namespace = dict(plain.bound)
    exec(compile(source, "<unfolded>", "exec"), namespace)
    args = [lin.weight.detach(), lin.bias.detach(), x]
    torch.testing.assert_close(build_callable(recipe)(list(args)), namespace["run"](list(args)), rtol=0, atol=0)


@pytest.mark.e2e
def test_cpu_fallbacks_count_at_every_replay():
    from hpu_backend.serve import fallback

    class Digamma(torch.nn.Module):
        def forward(self, x):
            return torch.special.digamma(x) * 2

    graphed = wrap_in_hpu_graph(Digamma())
    x = torch.rand(4, dtype=torch.bfloat16) + 0.5  # digamma has no bf16 HPU kernel: a CPU fallback
    before = fallback.counts()["aten::digamma"]
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(graphed(x), torch.special.digamma(x) * 2)
    assert fallback.counts()["aten::digamma"] - before == 3


def _uses(compiled, calls):
    """Run ``compiled`` on each input; the number of calls that went through a graph's bucket dispatch."""
    from hpu_backend.serve.compiled import listen

    events = []
    with listen(lambda e: events.append(e.kind)), torch.no_grad():
        outs = [compiled(x) for x in calls]
    return outs, events.count("use")


def test_reduce_overhead_replays_after_one_capture_on_a_miss_and_on_a_program_hit():
    model = _mlp()
    xs = [torch.randn(4, 16, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    for attempt in ("compiled", "served from the stored program"):
        torch._dynamo.reset()
        compiled = torch.compile(copy.deepcopy(model), backend="hpu_backend", mode="reduce-overhead")
        outs, uses = _uses(compiled, xs)
        assert uses == 1, attempt  # the capture; the replays skip the dispatch
        for out, x in zip(outs, xs):
            torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    torch._dynamo.reset()
    _, default_uses = _uses(torch.compile(copy.deepcopy(model), backend="hpu_backend"), xs)
    assert default_uses == len(xs)


@pytest.mark.e2e
def test_reduce_overhead_captures_each_shape_of_a_dynamic_graph():
    gpt = load_model_file("gpt")
    model = gpt.make_model().eval()
    compiled = torch.compile(copy.deepcopy(model), backend="hpu_backend", mode="reduce-overhead", dynamic=True)
    tokens = [gpt.make_inputs(2, seq)[0] for seq in (8, 16, 8, 16, 8)]
    outs, uses = _uses(compiled, tokens)
    assert uses == 2
    for out, t in zip(outs, tokens):
        torch.testing.assert_close(out, model(t), rtol=0, atol=0)


@pytest.mark.e2e
def test_reduce_overhead_replays_a_program_served_through_a_float_restart():
    """GPT's float inputs make Dynamo trace twice (AOTAutograd specializes them): the stored program is reached
    through its restart entry and leaves the floats out; it is replayed all the same."""
    from hpu_backend.serve.compiled import listen

    gpt = load_model_file("gpt")
    model = gpt.make_model().eval()
    tokens = [gpt.make_inputs(2, seq)[0] for seq in (8, 16, 8, 16, 8)]
    with torch.no_grad():
        torch.compile(copy.deepcopy(model), backend="hpu_backend", dynamic=True)(tokens[0])  # stores the program
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="hpu_backend", mode="reduce-overhead", dynamic=True)
    hits = []
    with listen(lambda e: hits.append(1) if e.kind == "program" and getattr(e, "hit", False) else None):
        outs, uses = _uses(compiled, tokens)
    assert len(hits) == 2 and uses == 2  # the restart entry and the program it names; a capture per length
    for out, t in zip(outs, tokens):
        torch.testing.assert_close(out, model(t), rtol=0, atol=0)


def test_reduce_overhead_training_keeps_autograd():
    model = _mlp().train()
    compiled = torch.compile(model, backend="hpu_backend", mode="reduce-overhead")
    compiled(torch.randn(2, 16)).sum().backward()
    assert model[0].weight.grad is not None


def test_an_unknown_mode_is_named_once(caplog):
    model = _mlp()
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(model, backend="hpu_backend", mode="max-autotune-no-cudagraphs")(torch.randn(2, 16))
    lines = [r.message for r in caplog.records if "mode=" in r.message]
    assert len(lines) == 1 and "max-autotune-no-cudagraphs" in lines[0] and "ignored" in lines[0]
