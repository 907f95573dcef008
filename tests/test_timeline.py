"""The step timeline: syncs, copies and host-bound steps on the simulated device (a clock that stands still, so
the host's time is the bridge's constants alone and every run is exact), the trace's layout, the streaming
reader's one-line errors, and ``hpurecipe perf-tool`` over the checked-in sample trace."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

import hpu_backend.device as hd
from hpu_backend.gaudi import mark_step
from hpu_backend.timeline import guidance, trace, whatif
from hpu_backend.timeline.host import HOST
from hpu_backend.timeline.model import Cost, steady
from hpu_backend.timeline.record import Recorder

hd.enable("eager")  # before this process's first backward (see test_device.py)
SAMPLE = Path(__file__).parent / "samples" / "mnist_trace.json"


@pytest.fixture
def lazy_device():
    hd.enable("lazy")  # in the test's own device context (conftest)
    yield hd.current()
    hd.enable("eager")


def _still(device) -> None:
    device.timeline = Recorder(device.mode, clock=lambda: 0.0)


def _train(device, steps: int, print_every: int, pin: bool = False) -> list[tuple]:
    """A Gaudi-style training loop; the events its timeline recorded."""
    _still(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("hpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 256, 8))
    loader = torch.utils.data.DataLoader(data, batch_size=256, pin_memory=pin)
    for i, (x,) in enumerate(loader):
        loss = model(x.to("hpu", non_blocking=pin)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark_step()
        if i % print_every == 0:
            print(loss.item())  # the print
    return list(device.timeline.events)


_PRINT_OFFSET = next(i for i, line in enumerate(inspect.getsource(_train).splitlines()) if "# the print" in line)
PRINT_LINE = f"{Path(__file__).name}:{_PRINT_OFFSET + _train.__code__.co_firstlineno}"


def _shown(events: list[tuple], line: str) -> tuple[float, float]:
    """(mean steady step, what the syncs at ``line`` take per steady step: the wait and the read-back)."""
    rows = steady(whatif.steps_of(events, "gaudi2"))
    at = sum(w + HOST.sync_s for s in rows for what, src, w in s.syncs if src.endswith(line))
    return sum(s.time_s for s in rows) / len(rows), at / len(rows)


@pytest.mark.e2e
def test_a_print_every_step_is_a_sync_at_its_line_and_every_20th_saves_what_the_timeline_shows(lazy_device, tmp_path,
                                                                                                capsys):
    every, twentieth = _train(lazy_device, 22, 1), _train(lazy_device, 22, 20)
    (step_every, sync_every), (step_20, sync_20) = _shown(every, PRINT_LINE), _shown(twentieth, PRINT_LINE)
    assert sync_every > sync_20 > 0
    assert step_every > step_20
    assert step_every - step_20 == pytest.approx(sync_every - sync_20, rel=1e-6)
    path = tmp_path / "t.json"
    trace.write(str(path), whatif.schedule(every, "gaudi2", spans=True).spans)
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    waits = [e for e in spans if e["cat"] == "Sync" and e["args"].get("source", "").endswith(PRINT_LINE)]
    assert waits and all(e["args"]["estimate"] is True for e in waits)


def test_pinned_non_blocking_copies_shorten_the_copy_spans_and_the_step(lazy_device):
    pageable, pinned = _train(lazy_device, 6, 100), _train(lazy_device, 6, 100, pin=True)
    # the model's four parameters go up from pageable memory, then the loader's six pinned batches
    assert [e[3:5] for e in pinned if e[0] == "copy"] == [(False, False)] * 4 + [(True, True)] * 6
    host_side = {}
    for name, events in (("pageable", pageable), ("pinned", pinned)):
        spans = whatif.schedule(events, "gaudi2", spans=True).spans
        host_side[name] = sum(s.dur_s for s in spans if s.name.startswith(("stage ", "copy wait")))
        dma = [s.dur_s for s in spans if s.row == "DMA"]
        assert len(dma) == 10
    assert host_side["pinned"] < host_side["pageable"] / 2  # what is left: the parameters' pageable copies
    assert whatif.step_s(pinned, "gaudi2") < whatif.step_s(pageable, "gaudi2")


def test_a_host_bound_toy_model_is_host_bound_and_hpu_graphs_close_most_of_the_gap(lazy_device):
    _still(lazy_device)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(12)]).to("hpu").eval()
    with torch.no_grad():
        for _ in range(6):
            model(torch.randn(4, 8).to("hpu"))
            mark_step()
    events = list(lazy_device.timeline.events)
    rows = steady(whatif.steps_of(events, "gaudi2"))
    assert {s.bound for s in rows} == {"host"}
    graphs = steady(whatif.steps_of(whatif.hpu_graphs(events), "gaudi2"))
    gap = sum(s.time_s - s.device_s for s in rows)
    assert sum(s.time_s - s.device_s for s in graphs) < 0.5 * gap
    assert sum(s.device_s for s in graphs) == pytest.approx(sum(s.device_s for s in rows))


# -- the trace -----------------------------------------------------------------------------------------------


def _events(steps: int = 3) -> list[tuple]:
    cost = Cost(((2e-4, 5e-5, 1e-4, 5e-6, 2.05e-4),), (("all_reduce", 1e-4, 0),))
    one = [("py", 1e-4), ("copy", 1 << 20, True, False, False, "x.py:3"), ("op", "lazy"),
           ("launch", "lazy", "lazy_graph_0001", 7, cost, 0.0), ("sync", "Tensor.item", "x.py:9"), ("step",)]
    return one * steps


def test_the_trace_has_the_device_process_its_engine_rows_recipes_and_estimates(tmp_path):
    path = tmp_path / "t.json"
    trace.write(str(path), whatif.schedule(_events(), "gaudi2", spans=True).spans, rank=3)
    doc = json.loads(path.read_text())  # valid JSON as a whole, too
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    names = {e["args"]["name"] for e in meta if e["name"] in ("process_name", "thread_name")}
    assert {"/device:HPU:3", "Recipe", "MME", "TPC", "DMA", "Network", "Launch", "Sync", "Steps"} <= names
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all({"pid", "tid", "ts", "dur", "name"} <= set(e) for e in spans)
    kernels = [e for e in spans if e["cat"] in ("Recipe", "MME", "TPC")]
    assert kernels and all(e["args"]["recipe"] == "lazy_graph_0001" and e["args"]["recipe_id"] == 7
                           and e["args"]["estimate"] is True for e in kernels)
    assert [e["cat"] for e in spans].count("Network") == 3
    host_ops = [e for e in spans if e["cat"] == "Host ops" and e["args"].get("python_s")]
    assert host_ops and all(e["args"]["measured"] == "python_s" for e in host_ops)
    assert list(trace.events(str(path), chunk=64)) == doc["traceEvents"]  # streamed in small chunks: the same


def _partial_overlaps(events: list[dict]) -> list[tuple[str, str]]:
    """Pairs of spans on one row that overlap without nesting, in whole nanoseconds as Perfetto reads the
    microseconds (it drops the second of such a pair)."""
    rows, bad = {}, []
    for e in events:
        if e["ph"] == "X":
            begin = round(e["ts"] * 1000)
            rows.setdefault((e["pid"], e["tid"]), []).append((begin, -(begin + round(e["dur"] * 1000)), e["name"]))
    for spans in rows.values():
        open_ = []  # the enclosing spans: (end, name)
        for begin, neg_end, name in sorted(spans):
            while open_ and open_[-1][0] <= begin:
                open_.pop()
            if open_ and -neg_end > open_[-1][0]:
                bad.append((open_[-1][1], name))
            else:
                open_.append((-neg_end, name))
    return bad


def test_spans_on_a_row_nest_or_are_disjoint_to_the_nanosecond(tmp_path):
    from hpu_backend.timeline.model import Span
    from hpu_backend.timeline.training import TrainingStep, schedule

    # back to back at 1000.6 ns, 2001.2 ns: the start and the length rounded apart overlapped the next by 1 ns
    edges = [i * 1.0006e-6 for i in range(6)]
    touching = [Span("device", "DMA", f"copy {i}", a, b - a, {}) for i, (a, b) in enumerate(zip(edges, edges[1:]))]
    step = TrainingStep(layers=3, forward_s=3e-6, backward_s=6.1e-6, accumulation=2, gather_s=0.7e-6,
                        optimizer_s=0.4e-6, grads=(("reduce_scatter", 0.33e-6, 4, True),))
    for name, spans in [("touching", touching), ("run", whatif.schedule(_events(), "gaudi2", spans=True).spans),
                        ("training", schedule(step, spans=True)["spans"])]:
        path = tmp_path / f"{name}.json"
        trace.write(str(path), spans)
        events = json.loads(path.read_text())["traceEvents"]
        assert _partial_overlaps(events) == [], name
    assert _partial_overlaps(list(trace.events(str(SAMPLE)))) == []  # the recorded run's, too
    assert _partial_overlaps([{"ph": "X", "pid": 1, "tid": 1, "name": n, "ts": t, "dur": 1.0}
                              for n, t in (("a", 0.0), ("b", 0.999))]) == [("a", "b")]  # the check can fail


def test_a_trace_without_our_step_spans_is_read_by_its_rows(tmp_path):
    path = tmp_path / "t.json"
    spans = [s for s in whatif.schedule(_events(4), "gaudi2", spans=True).spans if s.row != "Steps"]
    trace.write(str(path), spans)
    doc = guidance.report(str(path))
    assert doc["steps"] == 0 and doc["device_s"] > 0 and doc["host_s"] > 0 and 0 < doc["share"] <= 1


def test_perf_tool_names_syncs_and_their_line_on_a_sync_heavy_trace(tmp_path):
    path = tmp_path / "t.json"
    trace.write(str(path), whatif.schedule(_events(6), "gaudi2", spans=True).spans)
    doc = guidance.report(str(path))
    assert doc["limiting"] in ("host", "MME", "syncs") and 0 < doc["share"] <= 1
    advice = {a["what"]: a for a in doc["advice"]}
    assert advice["fewer syncs"]["gain_s"] > 0 and "x.py:9" in advice["fewer syncs"]["detail"]
    assert advice["pinned memory"]["gain_s"] > 0


@pytest.mark.parametrize("text, message", [
    ("hello", "not JSON"),
    ('{"traceEvents": [{"ph": "X", "ts": 1', "not JSON"),
    ('{"schema": 1, "rows": []}', "not a trace"),
    ('{"schema": 1, "rows": [', "not JSON"),
    ('{"traceEvents": 3}', "not a trace"),
    ('[{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]', "no device rows"),
])
def test_bad_traces_are_one_line_each(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(trace.TraceError) as e:
        guidance.report(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_oversized_event_stops_the_reader_without_reading_on(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "MAX_EVENT_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text('{"traceEvents": [{"name": "' + "x" * 5000)
    with pytest.raises(trace.TraceError, match="over 1000 bytes"):
        list(trace.events(str(path), chunk=256))


def test_a_trace_path_in_a_missing_folder_or_a_read_only_place_is_one_line(tmp_path):
    with pytest.raises(trace.TraceError, match="no such directory"):
        trace.check_writable(str(tmp_path / "missing" / "t.json"))
    with pytest.raises(trace.TraceError, match="--trace /proc/"):
        trace.write("/proc/hpu_trace.json", [])


def test_perf_tool_cli_over_the_sample_trace_and_a_bad_one(tmp_path):
    from typer.testing import CliRunner

    from hpurecipe.main import app

    result = CliRunner().invoke(app, ["perf-tool", "--trace", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    assert "limiting resource: host" in result.output and "HPU Graphs" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(app, ["perf-tool", "--trace", str(bad)])
    assert result.exit_code == 1 and "not a trace" in result.output and "Traceback" not in result.output


# -- the advisor -------------------------------------------------------------------------------------------

LOOP = """
for step in range(100):
    loss = model(x)
    print(loss.item())
    if step % 20 == 0:
        print(loss.cpu())
"""


def test_the_advisor_finds_reads_in_loops_with_their_rate_and_gains_from_the_timeline():
    import ast
    from types import SimpleNamespace

    from hpu_backend.diagnosis import timeline_advice

    reads = timeline_advice.loop_reads(ast.parse(LOOP))
    assert reads == {4: (".item", 1), 6: (".cpu", 20)}
    cost = {"cost": {"clusters": [{"id": 0, "mme_s": 3e-4, "tpc_s": 0, "hbm_s": 1e-4, "launch_s": 5e-6,
                                   "time_s": 3.05e-4}]}}
    recipe = SimpleNamespace(name="g", nodes=[SimpleNamespace(engine="mme")] * 3, facts=cost)
    events = timeline_advice.step_events([recipe], 1 << 20, False, False, reads, "m.py")
    every = whatif.gain(events, whatif.without_syncs("m.py:4"), "gaudi2")
    twentieth = whatif.gain(events, whatif.without_syncs("m.py:6"), "gaudi2")
    assert every > 0 and twentieth > 0 and every > 10 * twentieth
    assert whatif.gain(events, whatif.pinned, "gaudi2") > 0
    pinned = timeline_advice.step_events([recipe], 1 << 20, True, True, reads, "m.py")
    assert whatif.gain(pinned, whatif.pinned, "gaudi2") == 0


def test_analyze_writes_a_trace_with_a_step_per_bucket_and_refuses_a_missing_folder(tmp_path):
    from cli_helpers import cli, tiny_model

    model, path = tiny_model(tmp_path), tmp_path / "plan.json"
    cli("analyze", str(model), "--trace", str(path))
    doc = json.loads(path.read_text())
    assert doc["otherData"]["steps"] == ["batch=2", "batch=8"]
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans if e["cat"] == "Steps"] == ["step 0", "step 1"]
    assert any(e["cat"] == "Recipe" and e["args"]["estimate"] is True for e in spans)
    assert any(e["cat"] == "Compile" and "measured" in e["args"] for e in spans)
    result = cli("analyze", str(model), "--trace", str(tmp_path / "no" / "t.json"), code=2)
    assert "no such directory" in result.stderr and "Traceback" not in result.stderr


# -- training steps ------------------------------------------------------------------------------------------


def test_zero3_gathers_hide_under_long_layers_and_show_under_short_ones():
    from hpu_backend.timeline.training import TrainingStep, schedule

    def step(layer_s: float) -> dict:
        return schedule(TrainingStep(layers=4, forward_s=4 * layer_s, backward_s=8 * layer_s, accumulation=2,
                                     gather_s=1.0, grads=(("reduce_scatter", 0.5, 2, True),)))

    long, short = step(3.0), step(0.1)
    # only the first gather of each pass (forward, backward) of each micro-step waits
    assert long["exposed_s"]["all_gather"] == pytest.approx(2 * 2 * 1.0)
    assert short["exposed_s"]["all_gather"] > 3 * long["exposed_s"]["all_gather"]
    assert short["step_s"] >= 2 * (8 * 1.0 + 2 * 0.5)  # the network stream bounds it: gathers and reduce-scatters


def test_the_training_plan_can_find_zero3_slower_than_zero1():
    from hpu_backend.planning.training_plan import Layout, step_time

    fwd = {"parameters": 1e9, "time_s": 0.002, "exposed_comm_s": 0.0, "head_flops": 0.0, "layers": 32,
           "comm_s": 0.0, "collectives": 0}
    times = {z: step_time(Layout(8, 1, z, "none", 25.0, 1, 8), fwd, "gaudi2", "bf16") for z in (1, 3)}
    assert times[3]["step_s"] > times[1]["step_s"]
    gathers = next(r for r in times[3]["collectives"] if r["kind"] == "all_gather")
    assert gathers["count"] == 2 * 8 * 32 and gathers["exposed_s"] > 0


def test_one_trace_file_per_rank():
    assert trace.rank_path("out/t.json", 0, 1) == "out/t.json"
    assert [trace.rank_path("out/t.json", r, 2) for r in (0, 1)] == ["out/t-rank0.json", "out/t-rank1.json"]


def test_a_layered_step_is_its_first_layer_and_one_kernel_per_further_layer():
    from types import SimpleNamespace

    from hpu_backend.planning.plan_trace import request_events, step_cost

    def lowered(n: int):
        clusters = [{"id": i, "mme_s": 2.0, "tpc_s": 1.0, "hbm_s": 0.5, "launch_s": 0.1, "time_s": 2.1}
                    for i in range(n)]
        return SimpleNamespace(at=lambda point: SimpleNamespace(facts={"cost": {"clusters": clusters}}))

    step = SimpleNamespace(one=lowered(1), two=lowered(2), layers=5, groups=5)  # groups of one layer
    cost = step_cost(step, {})
    assert len(cost.clusters) == 5 and cost.device_s == pytest.approx(5 * 2.1)
    events = request_events(step, step, 4, 8, [8, 9, 10])
    assert [e[0] for e in events].count("step") == 4  # the prefill and three decode steps
    assert all(e[1] == "replay" for e in events if e[0] == "launch")


# -- compiles and the steady step ------------------------------------------------------------------------------


def _iteration(compile_s: float) -> list[tuple]:
    """One iteration of a device-bound loop: a copy, a graph of 4 ms on the MME (built in ``compile_s``), a read."""
    cost = Cost(((4e-3, 1e-3, 1e-3, 5e-6, 4e-3),))
    return [("copy", 1 << 16, True, True, True, "x.py:3"), ("op", "lazy"), ("op", "lazy"),
            ("launch", "lazy", "lazy_graph_0001", 1, cost, compile_s), ("py", 1e-4), ("sync", "Tensor.item", "x.py:9")]


def test_a_one_step_run_is_its_step_without_its_compiles_and_reports_the_compiles_apart(lazy_device):
    from hpu_backend.device.report import timeline
    from hpu_backend.run.report import render

    # no mark_step: the whole run is one step; the script's setup and the graph's 2 s build are not the step
    events = [("py", 0.5)] + _iteration(2.0) + _iteration(0.0) * 4 + [("step",)]
    (whole,) = whatif.steps_of(events, "gaudi2")
    assert whole.bound == "host" and whole.compile_s == 2.0 and whole.setup_s == 0.5
    spans = whatif.schedule(events, "gaudi2", spans=True).spans
    assert [s.dur_s for s in spans if s.row == "Compile"] == [2.0]  # the compile stays on the trace
    (step,) = whatif.steady_steps(events, "gaudi2")
    assert step.compile_s == 0 and step.bound == "device"
    assert step.time_s == pytest.approx(whole.time_s - 2.0, abs=1e-3) and step.time_s < 0.03
    lazy_device.timeline = Recorder("lazy", clock=lambda: 0.0)
    lazy_device.timeline.events = events
    doc = timeline(lazy_device)
    assert doc["bound"] == "device" and doc["step_s"] == pytest.approx(step.time_s)
    assert doc["compiles"] == {"first_step_s": 2.0, "total_s": 2.0, "steps": [0], "left_out_of_steady": True,
                               "measured": doc["compiles"]["measured"]}
    line = render({"timeline": doc})[-1]
    assert "step 0 without its compiles" in line and "device-bound; compiles 2000.000 ms in step 0 (measured" in line


def test_the_steady_steps_follow_the_last_compiling_step_and_the_first_steps_compiles_are_apart():
    events = [("py", 0.5)] + _iteration(2.0) + [("step",)] + _iteration(0.5) + [("step",)] \
        + (_iteration(0.0) + [("step",)]) * 3
    steps = whatif.steps_of(events, "gaudi2")
    assert [s.compile_s for s in steps] == [2.0, 0.5, 0.0, 0.0, 0.0]
    rows = whatif.steady_steps(events, "gaudi2")
    assert [s.step for s in rows] == [2, 3, 4] and all(s.bound == "device" for s in rows)
    assert whatif.step_s(events, "gaudi2") == pytest.approx(sum(s.time_s for s in rows) / 3)


def test_a_training_step_trace_has_gathers_buckets_and_the_optimizer_on_their_rows(tmp_path):
    from hpu_backend.timeline.training import TrainingStep, schedule

    step = TrainingStep(layers=3, forward_s=3.0, backward_s=6.0, accumulation=2, gather_s=0.5, optimizer_s=0.4,
                        grads=(("reduce_scatter", 0.2, 4, True),))
    out = schedule(step, spans=True)
    assert out["step_s"] == schedule(step)["step_s"]  # laying it out changes nothing
    path = tmp_path / "train.json"
    trace.write(str(path), out["spans"])
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert all(e["args"]["estimate"] is True for e in events)
    rows = {}
    for e in events:
        rows.setdefault(e["cat"], []).append(e)
    gathers = [e for e in rows["Network"] if e["args"]["kind"] == "all_gather"]
    buckets = [e for e in rows["Network"] if e["args"]["kind"] == "reduce_scatter"]
    assert len(gathers) == 2 * 2 * 3 and len(buckets) == 2 * 4  # per micro-step: both passes' layers; 4 buckets
    assert [e["name"] for e in rows["Recipe"][:6]] == [f"forward layer {i}" for i in range(3)] + \
        [f"backward layer {i}" for i in (2, 1, 0)]
    (opt,) = rows["TPC"]
    assert opt["ts"] >= max(e["ts"] + e["dur"] for e in buckets) - 1e-3  # waits for the last gradient bucket
    (total,) = rows["Steps"]
    assert total["dur"] == pytest.approx(out["step_s"] * 1e6) and total["args"]["exposed_s"] == out["exposed_s"]
    p = guidance.read(str(path))
    assert guidance.limiting(p)[0] == "Network" and p.engines["Network"] == pytest.approx(sum(
        e["dur"] for e in rows["Network"]) / 1e6)


@pytest.mark.e2e
def test_analyze_train_writes_the_planned_step_as_a_trace(tmp_path):
    from cli_helpers import cli

    path = tmp_path / "train.json"
    cli("analyze", "models/llama.py", "--train", "--seq", 32, "--global-batch", 8, "--cards", 2, "--zero", 3,
        "--bucket-mb", 0.05, "--trace", str(path))
    doc = json.loads(path.read_text())
    assert doc["otherData"]["tool"] == "analyze (training)" and doc["otherData"]["layout"]["zero"] == 3
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "/device:HPU:0" in names
    kinds = {e["args"].get("kind") for e in doc["traceEvents"] if e.get("cat") == "Network"}
    assert kinds == {"all_gather", "reduce_scatter"}
    assert any(e.get("cat") == "TPC" and e["name"] == "optimizer step (AdamW)" for e in doc["traceEvents"])


def test_the_report_puts_each_steps_measured_wall_time_beside_the_estimate():
    """A step's estimate is a Gaudi's; what it took here is measured beside it: the script's share and the
    simulator's own (their sum is the step's wall time, each step end carrying the host's clock)."""
    from hpu_backend.timeline.model import Schedule

    events = [("py", 0.5), ("op", "eager"), ("py", 0.010), ("step", 0.030, 10.0),
              ("op", "eager"), ("py", 0.012), ("step", 0.028, 10.040)]
    steps = Schedule("gaudi2").run(events).finish()
    assert steps[0].wall_s is None and steps[0].simulator_s == 0.030
    assert steps[1].wall_s == pytest.approx(0.040) and steps[1].simulator_s == 0.028
    assert steps[1].summary()["measured_wall_s"] == pytest.approx(0.040)


def _loop(device, use_loader: bool, steps: int = 6) -> list[tuple]:
    """A training loop whose batches come from a DataLoader, or are made in the loop (no DataLoader); a clock
    that moves, so the Python before each step's first copy is measured."""
    ticks = iter(range(10**9))
    device.timeline = Recorder(device.mode, clock=lambda: next(ticks) * 1e-3)
    model = torch.nn.Linear(8, 1).to("hpu")
    batches = [(torch.randn(64, 8),) for _ in range(steps)]
    source = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat([b for b, in batches])),
                                         batch_size=64) if use_loader else batches
    for (x,) in source:
        model(x.to("hpu")).sum().backward()
        mark_step()
    return list(device.timeline.events)


def test_perf_tool_suggests_loader_workers_only_to_a_script_that_uses_a_dataloader(lazy_device, tmp_path):
    """The user's script made its batches in the loop: perf-tool told it to raise DataLoader num_workers."""
    advice = {}
    for use_loader in (False, True):
        events = _loop(lazy_device, use_loader)
        assert events.count(("loader",)) == (6 if use_loader else 0)  # once per step whose input came from one
        path = tmp_path / f"loader_{use_loader}.json"
        trace.write(str(path), whatif.schedule(events, "gaudi2", spans=True).spans)
        doc = guidance.report(str(path))
        assert doc["host_s"] > doc["device_s"]  # host-bound: the Python before the copy is on the critical path
        advice[use_loader] = [a["what"] for a in doc["advice"]]
    assert "more loader workers" not in advice[False] and "more loader workers" in advice[True]
    old = guidance.Parts(steps=4, step_s=1.0, host_s=1.0, input_s=0.5, device_s=0.1)  # a trace that does not say
    assert "more loader workers" in [a.what for a in guidance.advise(old)]
