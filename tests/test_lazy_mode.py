"""Lazy mode: eager-style training scripts run graph by graph (cut at mark_step and host reads), each graph a
recipe, with results equal to eager; the per-step report; PT_HPU_MAX_COMPOUND_OP_SIZE; a second process."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from conftest import load_model_file, run_python
from hpu_backend import gaudi
from hpu_backend.diagnosis.report import GraphReport
from hpu_backend.lowering.passes.partition import partition
from hpu_backend.lowering.passes.place import place
from hpu_backend.serve.compiled import collect_recipes
from hpu_backend.settings import Settings
from test_lowering_helpers import context

training = load_model_file("lazy_training")


def _last_step() -> int:
    """The index of the latest step the lazy report holds (-1: none). The report keeps the latest steps only, so a
    test marks where it starts by step index, not by the report's length."""
    report = gaudi.lazy_report()
    return report[-1].index if report else -1


def _steps_since(before: int) -> list:
    return [s for s in gaudi.lazy_report() if s.index > before]


def _assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def _scheduled_steps(model, x, opt, sched, steps: int) -> torch.nn.Module:
    """A Gaudi-style loop with a learning rate schedule: mark_step after backward and after the optimizer step."""
    for _ in range(steps):
        model(x).square().mean().backward()
        gaudi.mark_step()
        opt.step()
        opt.zero_grad()
        gaudi.mark_step()
        sched.step()
    return model


def _own_store(tmp_path) -> dict:
    """Options of a lazy block with a recipe store of its own: its first graphs compile whatever ran before in this
    process (the suite runs in random order, several tests to a process)."""
    return {"cache_config": f"{tmp_path / 'recipes'},false,64"}


@pytest.mark.e2e
def test_mnist_loop_of_the_docs_matches_eager_for_20_steps_and_compiles_nothing_after_the_first(tmp_path):
    mnist = load_model_file("mnist")
    eager_losses, eager_model = training.mnist_run(mnist, steps=20)
    before = _last_step()
    with gaudi.lazy(_own_store(tmp_path)):
        lazy_losses, lazy_model = training.mnist_run(mnist, steps=20, log_interval=10)
    torch.testing.assert_close(lazy_losses, eager_losses)
    _assert_same_params(lazy_model, eager_model)
    steps = _steps_since(before)
    marked = [s for s in steps if s.graphs and s.graphs[-1].cut_by == "mark_step"]
    assert len(marked) == 40  # one forward+backward and one optimizer graph per iteration
    assert sum(s.compiled for s in marked[:2]) > 0
    assert [s.compiled for s in marked[2:]] == [0] * 38  # the second iteration of a steady loop compiles nothing
    assert all(len(s.graphs) == 1 for s in marked[2:])
    logged = [sync for s in steps for sync in s.syncs if sync.what == "Tensor.item"]
    assert [s.source.rsplit(":", 1)[0] for s in logged] == [training.__file__] * 2  # the print, at steps 0 and 10
    assert not any(s.cut for s in logged)  # after mark_step: nothing pending to cut


@pytest.mark.e2e
def test_gpt_training_loop_matches_eager_and_compiles_nothing_once_steady(tmp_path):
    gpt = load_model_file("gpt")
    eager_losses, eager_model = training.gpt_run(gpt, steps=20)
    before = _last_step()
    with gaudi.lazy(_own_store(tmp_path)):
        lazy_losses, lazy_model = training.gpt_run(gpt, steps=20)
    torch.testing.assert_close(lazy_losses, eager_losses)
    _assert_same_params(lazy_model, eager_model)
    marked = [s for s in _steps_since(before) if s.graphs and s.graphs[-1].cut_by == "mark_step"]
    assert len(marked) == 40  # forward+backward, then the optimizer step, each ended by mark_step
    # torch's SGD creates the momentum buffers in its first step (buf = grad) and updates them from the second on
    # (buf = 0.9 buf + grad): that second optimizer graph is the only compile after the first iteration.
    assert [s.compiled for s in marked[2:]] == [0, 1] + [0] * 36
    assert max(g.ops for s in marked for g in s.graphs) > 100  # forward and backward in one graph


def test_a_new_constant_every_iteration_is_a_new_graph_every_step_and_the_report_says_which(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    # A learning rate no other test uses: its step constants are new to this process's recipe store, whatever
    # ran before in it (the suite runs in random order).
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # the learning rate changes every step
    x = torch.randn(16, 8)
    reference = torch.nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    for _ in range(4):
        reference(x).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_sched.step()
    before = _last_step()
    with gaudi.lazy(_own_store(tmp_path)):
        _scheduled_steps(model, x, opt, sched, 4)
    _assert_same_params(model, reference)
    optimizer_steps = _steps_since(before)[1::2]
    assert [s.compiled for s in optimizer_steps[1:]] == [1, 1, 1]
    for s in optimizer_steps[1:]:
        (graph,) = s.graphs
        assert "a constant changed: aten.add.Tensor argument alpha" in graph.new, graph.new
        assert "-0.15" in graph.new or "-0.075" in graph.new or "-0.0375" in graph.new


def test_graphs_that_differ_in_one_constant_never_share_a_recipe():
    """A graph run before is found by its structure as recorded (no GraphModule, no program key): graphs that
    differ only in a constant's sign, its type (1 and 1.0) or an argument each run their own recipe."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    variants = [lambda t: 1 / (t * 0.0), lambda t: 1 / (t * -0.0), lambda t: t.sum(0), lambda t: t.sum(1),
                lambda t: torch.div(t, 2, rounding_mode="floor"), lambda t: torch.div(t, 2.0, rounding_mode="floor"),
                lambda t: t.transpose(0, 1).contiguous() + 1, lambda t: t.contiguous() + 1]
    expected = [fn(x) for fn in variants]
    with gaudi.lazy():
        for _ in range(2):  # the second round finds each graph by its recorded structure
            got = []
            for fn in variants:
                got.append(fn(x))
                gaudi.mark_step()
            for value, want in zip(got, expected):
                torch.testing.assert_close(value, want, rtol=0, atol=0)
    assert torch.equal(got[0], torch.full((2, 2), float("inf"))) and torch.equal(got[1], -got[0])


def test_foreach_adamw_with_a_scheduled_learning_rate_matches_eager_and_stops_compiling(tmp_path):
    """torch's foreach AdamW passes its step sizes and bias corrections as Python numbers, one per parameter,
    new every step (and the weight decay factor, new with each learning rate): the recorder gives them to the
    graph as float32 tensors through the ops' tensor overloads, so the optimizer's graph stops changing."""
    def run(steps: int) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1, foreach=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        return _scheduled_steps(model, torch.randn(16, 8, generator=torch.Generator().manual_seed(1)), opt, sched,
                                steps)

    reference = run(6)
    before = _last_step()
    with gaudi.lazy(_own_store(tmp_path)):
        model = run(6)
    _assert_same_params(model, reference)
    optimizer_steps = _steps_since(before)[1::2]
    assert len(optimizer_steps) == 6 and all(s.graphs for s in optimizer_steps)
    assert [s.compiled for s in optimizer_steps[2:]] == [0] * 4, [g.new for s in optimizer_steps for g in s.graphs]
    # no foreach op falls out of the graph to run on the host (AdamW's reads of its step counters, `.item()`,
    # cut it: they are host syncs here as on a Gaudi)
    cuts = [g.cut_by for s in optimizer_steps for g in s.graphs]
    assert not [c for c in cuts if "runs on the host" in c] and "mark_step" in cuts, cuts


def test_host_reads_mid_step_cut_the_graph_and_are_reported_with_their_line():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    expected = []
    for step in range(3):
        loss = (x @ w).relu().sum()
        expected.append(loss.item())
    before = _last_step()
    got = []
    with gaudi.lazy():
        for step in range(3):
            loss = (x @ w).relu().sum()
            if loss > 0:  # Python control flow on a tensor: a host sync  (this line is checked below)
                got.append(loss.item())
            gaudi.mark_step()
    assert got == pytest.approx(expected)
    steps = _steps_since(before)
    assert len(steps) == 3
    for s in steps:
        cuts = [sync for sync in s.syncs if sync.cut]
        assert [c.what for c in cuts] == ["Tensor.__bool__"]
        assert cuts[0].source == f"{__file__}:{_line_of('if loss > 0:')}"
        assert s.graphs[0].cut_by == "Tensor.__bool__"
        assert [sync.what for sync in s.syncs if not sync.cut] == ["Tensor.item"]


def test_an_op_called_from_code_with_an_unhashable_constant_is_recorded():
    """Code objects Dynamo makes (T5 compiled through GaudiSeq2SeqTrainer) can hold a dict among their constants,
    which makes the code unhashable; the device asks every recorded op's frames whose they are."""
    def step(x):
        return (x + 1).sum()

    step.__code__ = step.__code__.replace(co_consts=step.__code__.co_consts + ({},))
    with pytest.raises(TypeError):
        hash(step.__code__)
    with gaudi.lazy():
        got = step(torch.ones(3))
        gaudi.mark_step()
    assert got.item() == 6.0


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


def test_views_in_place_updates_and_aliases_match_eager():
    def program(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        t = a.t()  # a view of an input
        c = (a * 2).detach()  # an alias of a temporary that dies
        b.add_(1)  # an in-place update of an input
        row = b[0]  # a view of the updated input reads the update
        d = torch.zeros(3)
        d.copy_(row)
        e = torch.nn.Parameter(torch.ones(3))  # a tensor made from a pending one
        a.mul_(t.t())  # an input written while its view is alive
        return [t.clone(), c, b.clone(), d, e * 2, a.clone(), row + t[0]]

    def inputs():
        torch.manual_seed(1)
        return torch.randn(3, 3), torch.randn(3, 3)

    a, b = inputs()
    expected = program(a, b) + [a, b]
    a, b = inputs()
    with gaudi.lazy():
        got = program(a, b)
        gaudi.mark_step()
    for x, y in zip(got + [a, b], expected):
        torch.testing.assert_close(x, y)


def test_slices_of_a_flat_buffer_are_written_in_one_graph_and_overlapping_reads_see_the_writes():
    """DeepSpeed's gradient bucket: each gradient copied into its slice of one flat buffer, the slices made after
    the first write. Writes into views of an input go back into those views at the end of the graph, so the
    copies stay in one graph; a read of memory the graph wrote (the whole bucket, an overlapping slice) cuts it
    first and sees the writes."""
    def program(flat: torch.Tensor, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        offset = 0
        for g in grads:
            flat.narrow(0, offset, g.numel()).copy_(g.view(-1))
            offset += g.numel()
        first = flat.narrow(0, 0, 4).clone()  # overlaps the first write
        flat.narrow(0, 2, 6).mul_(2)  # overlaps two writes
        return [first, flat.sum().reshape(1), flat.clone()]

    def inputs():
        torch.manual_seed(3)
        return torch.zeros(40), [torch.randn(2, 3), torch.randn(4), torch.randn(3, 3)]

    flat, grads = inputs()
    expected = program(flat, grads)
    flat, grads = inputs()
    before = _last_step()
    with gaudi.lazy():
        gaudi.mark_step()
        got = program(flat, grads)
        gaudi.mark_step()
    for x, y in zip(got + [flat], expected + [expected[-1]]):
        torch.testing.assert_close(x, y)
    cuts = [g.cut_by for s in _steps_since(before) for g in s.graphs]
    # the three copies in one graph, cut by the first overlapping read (nothing ran eagerly between)
    assert cuts and cuts[0] != "mark_step" and all("runs on the host" not in c for c in cuts), cuts
    assert len(cuts) <= 3, cuts


def test_gradient_accumulation_matches_eager():
    def run(lazy: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with gaudi.lazy() if lazy else contextlib.nullcontext():
            for step in range(3):
                for micro in range(2):  # gradients accumulate into .grad across backward calls
                    x = torch.randn(4, 6)
                    model(x.t().t()).sum().backward()  # a view of data as input
                    gaudi.mark_step()
                opt.step()
                opt.zero_grad(set_to_none=False)
                gaudi.mark_step()
        return model

    _assert_same_params(run(lazy=True), run(lazy=False))


def test_max_compound_op_size_caps_cluster_sizes_and_changes_the_key(monkeypatch):
    def f(x):
        for _ in range(5):
            x = torch.relu(x) * 2 + 1
        return x

    def clusters(**options):
        captured, ctx = context(f, torch.randn(8), **options)
        return partition(place(captured, ctx), ctx).facts["clusters"]

    assert clusters() == {"count": 1, "sizes": [15]}
    assert clusters(max_compound_op_size=4) == {"count": 4, "sizes": [4, 4, 4, 3]}
    monkeypatch.setenv("PT_HPU_MAX_COMPOUND_OP_SIZE", "6")
    settings = Settings.from_options({})
    assert settings.max_compound_op_size == 6 and settings.key_fields()["max_compound_op_size"] == 6
    assert "max_compound_op_size" not in Settings.from_options({}, env={}).key_fields()


def test_max_compound_op_size_caps_lazy_graphs_too():
    from hpu_backend.capture.lazy import LazyRecorder
    from hpu_backend.gaudi.lazy_mode import LazyRunner

    runner = LazyRunner(Settings.from_options({"max_compound_op_size": 3, "cache": False}))
    recorder = LazyRecorder(runner, runner.sync)
    x = torch.randn(8)
    with collect_recipes() as found:
        with recorder.host, recorder:
            y = ((x.relu() * 2 + 1).sin() - 3).abs()
        recorder.flush("test")
    torch.testing.assert_close(y, ((x.relu() * 2 + 1).sin() - 3).abs())
    (_, recipe, _), = found
    sizes = recipe.facts["clusters"]["sizes"]
    assert recipe.kind == "lazy" and max(sizes) <= 3 and sum(sizes) >= 6


def test_lazy_recipes_read_like_any_other():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with collect_recipes() as found, gaudi.lazy():
        model(x).sum().backward()
        gaudi.mark_step()
    reports = [GraphReport.from_recipe(r, hit) for _, r, hit in found]
    assert reports and all(r.name.startswith("lazy_graph_") for r in reports)
    assert all(r.est_time_s > 0 and r.clusters >= 1 for r in reports)


SCRIPT = """
import json, os, sys, torch
import hpu_backend.gaudi as htcore
from hpu_backend.metrics import metric_global
with htcore.lazy():  # lazy mode on host tensors, for the whole script
    assert htcore.is_lazy()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    htcore.mark_step()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = len(htcore.lazy_report())
    for step in range(3):
        x = torch.full((4, 8), 0.5)
        loss = model(x).square().mean()
        loss.backward()
        htcore.mark_step()
        opt.step()
        opt.zero_grad()
        htcore.mark_step()
    steps = htcore.lazy_report()[start:]
    print(json.dumps({"compiled": [s.compiled for s in steps], "loss": loss.item(),
                      "hits": dict(metric_global("recipe_cache").stats())["TotalHit"]}))
"""


@pytest.mark.e2e
def test_a_second_process_runs_the_lazy_recipes_from_the_disk_cache(tmp_path):
    env = {"PT_HPU_LAZY_MODE": "1", "PT_HPU_RECIPE_CACHE_CONFIG": f"{tmp_path / 'cache'},false,64"}
    first = json.loads(run_python(SCRIPT, env).splitlines()[-1])
    second = json.loads(run_python(SCRIPT, env).splitlines()[-1])
    assert sum(first["compiled"]) >= 2 and first["compiled"][2:] == [0] * 4
    assert second["compiled"] == [0] * 6 and second["hits"] >= 2
    assert second["loss"] == first["loss"]
    from cli_helpers import cli_json

    listed = cli_json("ls", "--cache-dir", tmp_path / "cache")
    rows = listed if isinstance(listed, list) else listed.get("entries", listed)
    lazy = [r for r in rows if str(r.get("graph", "")).startswith("lazy_graph_") and r.get("kind") == "lazy"]
    assert len(lazy) >= 2 and all(r["hits"] >= 1 for r in lazy), rows  # each one read back by the second process
    shown = cli_json("show", lazy[0]["key"], "--cache-dir", tmp_path / "cache")
    assert "lazy_graph_" in json.dumps(shown)


def test_analyze_reports_a_model_files_lazy_graphs(tmp_path):
    from cli_helpers import cli_json, tiny_model

    doc = cli_json("analyze", tiny_model(tmp_path), "--train", "--lazy")
    assert doc["lazy"] and [r["bucket"] for r in doc["buckets"]] == ["batch=2", "batch=8"]
    for row in doc["buckets"]:
        names = [g["name"] for g in row["graphs"]]
        assert names and all(n.startswith("lazy_graph_") for n in names), names
        assert row["time_s"] > 0 and row["graph_breaks"] == 0
    assert cli_json("analyze", tiny_model(tmp_path),
                    "--train")["buckets"][0]["graphs"][0]["name"].startswith("fx_graph")


def test_a_graph_that_cannot_be_lowered_runs_as_recorded(monkeypatch):
    from hpu_backend.lowering import LoweringError
    from hpu_backend.serve import compiled

    def fail(*args, **kwargs):
        raise LoweringError("planted failure")

    monkeypatch.setattr(compiled.CompiledGraph, "build", classmethod(fail))
    x = torch.randn(4, 4)
    # Not strict, said here: a block without options keeps the settings an earlier block of the process set
    # (another test's strict mode, in random order).
    with gaudi.lazy({"strict": False}):
        y = (x * 3).exp().sum(0)
        gaudi.mark_step()
    torch.testing.assert_close(y, (x * 3).exp().sum(0))


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss"])
def test_a_loss_with_its_default_reduction_matches_eager_in_lazy_mode(loss):
    """The lazy recorder keeps the call as issued (``mse_loss(a, b)``, reduction left to its default, the mean):
    the recipe must reduce as the schema says, not as a generated binding's own default would (none)."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(8, 8)
    lazy_model = torch.nn.Linear(8, 8)
    lazy_model.load_state_dict(eager.state_dict())
    x, y = torch.randn(2, 4, 8), torch.randn(2, 4, 8).sign()
    op = getattr(torch.ops.aten, loss).default
    op(eager(x), y).backward()
    with gaudi.lazy():
        value = op(lazy_model(x), y)
        value.backward()
        gaudi.mark_step()
    assert value.shape == ()
    torch.testing.assert_close(value, op(eager(x), y))
    _assert_same_params(lazy_model, eager)
    torch.testing.assert_close(lazy_model.weight.grad, eager.weight.grad)
