"""Hostile input to the launcher, its traces, the perf tool and the settings, in real processes where processes
matter: whatever kills the launcher, its ranks and the helpers they fork die with it (every launcher test checks
the process table afterwards); bad options and variables are one line naming them; a trace is never written
through a link or into a FIFO, and a malformed one is one line from the perf tool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from cli_helpers import cli, one_line

ROOT = Path(__file__).resolve().parent.parent
MARK = "HOSTILE_LAUNCHER_MARK"  # in the environment of every process a test starts, and so of their children


def env(mark: str, **extra) -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), out.get("PYTHONPATH", "")])
    out[MARK] = mark
    out.update(extra)
    return out


def marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``mark``."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # ended while we looked, or not ours to read
            continue
        if needle in environ.split(b"\0") and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


@pytest.fixture
def mark():
    """A fresh mark; after the test, nothing carrying it may still run (the process table is checked)."""
    if not os.path.isdir("/proc/self"):
        pytest.fail("these tests read the process table from /proc (Linux)")
    value = uuid.uuid4().hex
    yield value
    deadline = time.monotonic() + 30  # ranks stop on their parent-death signal: give a loaded machine time
    while marked(value) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = marked(value)
    for pid in left:  # never leave them to the next test, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


def script(tmp_path: Path, text: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# Each rank forks a helper that would sleep for 10 minutes, writes both pids, then rank 1 fails (``fail``) or
# every rank sleeps too.
HELPERS = """
    import os, subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rank = os.environ["RANK"]
    with open(os.path.join(sys.argv[1], f"pids.{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    os.replace(os.path.join(sys.argv[1], f"pids.{rank}.tmp"), os.path.join(sys.argv[1], f"pids.{rank}"))
    if sys.argv[2] == "fail" and rank == "1":
        time.sleep(0.5)
        raise RuntimeError("rank one fails after forking a helper")
    time.sleep(600)
"""


def start(tmp_path: Path, mark: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpu_backend.run", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(mark), cwd=tmp_path)


def wait_for_pids(tmp_path: Path, proc: subprocess.Popen, ranks: int) -> list[int]:
    deadline = time.monotonic() + 180
    files = [tmp_path / f"pids.{r}" for r in range(ranks)]
    while not all(f.exists() for f in files):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return [int(p) for f in files for p in f.read_text().split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_ranks_and_their_helpers_die_with_the_launcher(tmp_path, mark, sig):
    path = script(tmp_path, HELPERS)
    proc = start(tmp_path, mark, "--cards", "2", path, tmp_path, "sleep")
    pids = wait_for_pids(tmp_path, proc, 2)
    assert set(pids) <= set(marked(mark))  # two ranks and two helpers, running
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), err
    if sig != signal.SIGKILL:  # it had the time to say so, in one line of its own
        ours = [line for line in err.splitlines() if line.startswith("hpu_backend.run:")]
        assert ours == [f"hpu_backend.run: error: interrupted ({sig.name}); all ranks were stopped"], err
    # the fixture checks that none of the four (nor anything else started here) is left running


def test_a_failing_rank_takes_its_helpers_with_it(tmp_path, mark):
    path = script(tmp_path, HELPERS)
    proc = start(tmp_path, mark, "--cards", "2", path, tmp_path, "fail")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "rank 1 failed (RuntimeError: rank one fails after forking a helper)" in err, err


def test_a_failing_script_on_one_card_takes_its_helpers_with_it(tmp_path, mark):
    path = script(tmp_path, """\
        import subprocess, sys
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(sys.argv[1], "w").write(str(helper.pid))
        raise RuntimeError("fails after forking a helper")
        """)
    proc = start(tmp_path, mark, path, tmp_path / "helper.pid")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "RuntimeError: fails after forking a helper" in err, err
    assert (tmp_path / "helper.pid").read_text().isdigit()  # it ran; the fixture checks it is gone


def test_prefix_marks_every_line_and_ddp_ranks_print_no_timer_warning(tmp_path, mark):
    path = script(tmp_path, """\
        import os, sys, torch, torch.distributed as dist
        import habana_frameworks.torch.core as htcore
        import habana_frameworks.torch.distributed.hccl
        from torch.nn.parallel import DistributedDataParallel as DDP
        print("out", os.environ["RANK"]); print("err", os.environ["RANK"], file=sys.stderr)
        dist.init_process_group("hccl")
        model = DDP(torch.nn.Linear(4, 2).to("hpu"))
        model(torch.ones(3, 4, device="hpu")).sum().backward()
        htcore.mark_step()
        print("second", os.environ["RANK"], flush=True)
        dist.destroy_process_group()
        """)
    proc = start(tmp_path, mark, "--cards", "2", "--prefix", "--report", tmp_path / "r.json", path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    for r in (0, 1):
        assert [line for line in out.splitlines() if line.startswith(f"[rank{r}]: ")] == [
            f"[rank{r}]: out {r}", f"[rank{r}]: second {r}"], out
        assert f"[rank{r}]: err {r}" in err.splitlines(), err
    assert all(line.startswith("[rank") for line in out.splitlines()), out
    assert "Time stats" not in err, err  # DDP's reducer has no timer for the simulated device: not the user's concern


def test_ctrl_c_exits_130_and_the_report_shows_it(tmp_path, mark):
    path = script(tmp_path, """\
        import time
        print("ready", flush=True)
        time.sleep(600)
        """)
    proc = start(tmp_path, mark, path)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and f'File "{path}", line' in lines[1], err
    assert "KeyboardInterrupt" in lines, err  # the script's own traceback (it was in line 2 or 3), as Python ends
    assert f"{path} exited 130 after" in err, err  # the report's first line
    assert "hpu_backend.run:" not in err and "runpy" not in err, err


@pytest.mark.parametrize("args, variables, message", [
    (["--timeout", "nan"], {}, "--timeout must be a number of seconds more than 0, got nan"),
    (["--timeout", "inf"], {}, "--timeout must be a number of seconds more than 0, got inf"),
    (["--timeout", "-3"], {}, "--timeout must be a number of seconds more than 0, got -3"),
    (["--cards", "100000"], {}, "--cards 100000 needs about 30000.0 GB (300 MB per rank) and this machine has "),
    (["--report", "{tmp}/missing/report.json"], {}, "--report {tmp}/missing/report.json: no such directory"),
    (["--report", "{tmp}"], {}, "--report {tmp}: is a directory"),
    ([], {"WORLD_SIZE": "banana"}, "environment variable WORLD_SIZE='banana' is not valid: use a whole number"),
    ([], {"RANK": "banana"}, "environment variable RANK='banana' is not valid: use a whole number from 0 to "),
    ([], {"WORLD_SIZE": "2", "RANK": "2"}, "environment variable RANK='2' is not valid: use a whole number from 0 "
                                           "to WORLD_SIZE - 1 (1)"),
    ([], {"LOCAL_RANK": "-1"}, "environment variable LOCAL_RANK='-1' is not valid"),
    ([], {"HPU_BACKEND_TARGET": "bogus"}, "environment variable HPU_BACKEND_TARGET must be one of gaudi2, gaudi3, "
                                          "got 'bogus'"),
    ([], {"HPU_SIM_CARDS": "0"}, "environment variable HPU_SIM_CARDS='0' is not valid: use a whole number of cards"),
    ([], {"HPU_SIM_CARDS": "banana"}, "environment variable HPU_SIM_CARDS='banana' is not valid"),
    ([], {"HPU_BACKEND_HBM_BYTES": "banana"}, "environment variable HPU_BACKEND_HBM_BYTES='banana' is not valid: "
                                              "use a whole number of bytes, or a number with a unit"),
    ([], {"HPU_BACKEND_HBM_BYTES": "-1"}, "environment variable HPU_BACKEND_HBM_BYTES='-1' is not valid"),
    ([], {"HPU_BACKEND_BUCKETS": "exp:8:4"}, "environment variable HPU_BACKEND_BUCKETS: bucket policy 'exp:8:4': "
                                             "MIN 8 is above MAX 4"),
    ([], {"PT_HPU_MAX_COMPOUND_OP_SIZE": "10e30"}, "environment variable PT_HPU_MAX_COMPOUND_OP_SIZE must be a "
                                                   "whole number from 0 to 2147483647, got '10e30'"),
])
def test_bad_options_and_variables_are_one_line_before_anything_runs(tmp_path, monkeypatch, args, variables,
                                                                      message):
    path = script(tmp_path, "open('ran', 'w').close()\n")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    args = [a.format(tmp=tmp_path) for a in args]
    line = one_line(cli("run", *args, path, code=2))  # refused before the script runs: in-process is safe
    assert line.startswith("error: " + message.format(tmp=tmp_path)), line
    assert not (tmp_path / "ran").exists()


def test_an_unknown_option_is_named_not_taken_for_the_script(tmp_path):
    path = script(tmp_path, "print('ran')\n")
    line = one_line(cli("run", "--bogus", path, code=2))
    assert line == "error: no such option: --bogus (hpurecipe run's options come before SCRIPT; see hpurecipe " \
                   "run --help)", line
    proc = subprocess.run([sys.executable, "-m", "hpu_backend.run", "--bogus", str(path)], capture_output=True,
                          text=True, env=env("none"), timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr


def test_hbm_bytes_takes_units(monkeypatch):
    from hpu_backend.device.memory import CAPACITY_ENV, Memory
    from hpu_backend.settings import SettingsError

    for text, nbytes in (("1GB", 10 ** 9), ("16GiB", 16 << 30), ("1e6", 10 ** 6), ("4096", 4096)):
        monkeypatch.setenv(CAPACITY_ENV, text)
        assert Memory().capacity() == nbytes
    monkeypatch.setenv(CAPACITY_ENV, "1e6 apples")
    with pytest.raises(SettingsError, match="HPU_BACKEND_HBM_BYTES='1e6 apples' is not valid"):
        Memory().capacity()


# -- traces ---------------------------------------------------------------------------------------------------


TRACED = """
    import torch
    x = torch.ones(4, device="hpu")
    print((x * 2).sum().item())
"""


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_a_trace_path_that_is_not_a_regular_file_is_refused_up_front(tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = script(tmp_path, "open('ran', 'w').close()\n")
    trace = tmp_path / "trace.json"
    {"symlink": lambda: trace.symlink_to(victim), "directory": trace.mkdir, "fifo": lambda: os.mkfifo(trace)}[kind]()
    line = one_line(cli("run", "--trace", trace, path, code=2))
    what = {"symlink": "a symbolic link", "directory": "a directory", "fifo": "a FIFO"}[kind]
    assert line.startswith(f"error: --trace {trace}: {what}, not a regular file"), line
    assert victim.read_text() == "precious" and not (tmp_path / "ran").exists()


def test_a_link_planted_at_a_ranks_trace_is_refused_and_a_late_one_replaced(tmp_path, mark):
    from hpu_backend.timeline import trace as traces
    from hpu_backend.timeline.model import Span

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "t-rank1.json").symlink_to(victim)
    path = script(tmp_path, TRACED)
    proc = start(tmp_path, mark, "--cards", "2", "--trace", tmp_path / "t.json", path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and f"--trace {tmp_path / 't-rank1.json'}: a symbolic link" in err, err
    # A link planted after the check (between the run's start and its end): the trace replaces the link.
    late = tmp_path / "late.json"
    late.symlink_to(victim)
    with pytest.raises(traces.TraceError, match="a symbolic link"):
        traces.write(str(late), [Span("host", "Steps", "step", 0.0, 1e-3, {})])
    late.unlink()
    traces.write(str(late), [Span("host", "Steps", "step", 0.0, 1e-3, {})])
    assert victim.read_text() == "precious" and not late.is_symlink()
    assert [e["ph"] for e in traces.events(str(late))][-1] == "X"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".trace-")]  # no temporary file left


@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO"), ("directory", "a directory")])
def test_the_trace_writer_refuses_what_is_not_a_regular_file(tmp_path, kind, what):
    """What ``run`` and ``analyze --trace`` write through: never blocks on a FIFO, never writes into a folder."""
    from hpu_backend.timeline import trace as traces
    from hpu_backend.timeline.model import Span

    path = tmp_path / "trace.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(traces.TraceError, match=f"--trace {path}: {what}, not a regular file"):
        traces.write(str(path), [Span("host", "Steps", "step", 0.0, 1e-3, {})])
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_perf_tool_refuses_a_fifo_without_waiting(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    line = one_line(cli("perf-tool", "--trace", fifo, code=1))
    assert line == f"error: {fifo}: a FIFO, not a regular file (a trace is a file)", line


def _trace(tmp_path: Path, events: list, text: str | None = None) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text if text is not None else json.dumps({"traceEvents": events}))
    return path


META = {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "/device:HPU:0"}}


@pytest.mark.parametrize("events, text, message", [
    ([META, {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": "10"}], None, "an event's \"dur\" is \"10\", not a finite"),
    ([META, {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": [1]}], None, "an event's \"dur\" is a list, not a finite"),
    ([META, {"ph": "X", "pid": [2], "tid": 1, "ts": 0, "dur": 1}], None, "an event's \"pid\" is a list, not a number"),
    ([META, {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": -1}], None, "an event's \"dur\" is -1, not a finite "
                                                                          "number >= 0"),
    ([], '{"traceEvents": [' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "]}", "nested deeper than a trace event"),
    ([], '{"traceEvents": [{"ph": "X", "pid": 2, "tid": 1, "ts": NaN, "dur": 1}]}', "an event's \"ts\" is NaN"),
    ([META, {"ph": "X", "pid": 1, "tid": 1, "cat": "Steps", "ts": 0, "dur": 1, "args": {"time_s": float("nan")}}],
     None, "a step's args are not finite numbers"),
    ([META, {"ph": 7}], None, "an event's \"ph\" is 7, not a string"),
])
def test_perf_tool_checks_the_trace_schema_in_one_line(tmp_path, events, text, message):
    path = _trace(tmp_path, events, text)
    line = one_line(cli("perf-tool", "--trace", path, code=1))
    assert line.startswith(f"error: {path}: not a trace (") and message in line, line


def test_perf_tool_streams_a_trace_of_many_steps(tmp_path):
    """Steps are summed as they stream: the mean over the steady steps equals the mean of the list."""
    from hpu_backend.timeline import guidance

    steps = [{"time_s": 1e-3 * (i % 7 + 1), "host_s": 5e-4, "device_s": 1e-3 * (i % 7 + 1), "sync_s": 0.0,
              "compile_s": 0.2 if i == 3 else 0.0, "engines": {"MME": 1e-4 * i}} for i in range(2000)]
    events = [META, {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "Steps"}}]
    events += [{"ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": s} for i, s in enumerate(steps)]
    p = guidance.read(str(_trace(tmp_path, events)))
    steady = steps[4:]  # after the warm-up and the last step that compiled
    assert p.steps == 2000
    assert p.step_s == pytest.approx(sum(s["time_s"] for s in steady) / len(steady))
    assert p.engines["MME"] == pytest.approx(sum(s["engines"]["MME"] for s in steady) / len(steady))


def test_perf_tool_refuses_a_trace_of_endless_rows(tmp_path):
    from hpu_backend.timeline import guidance

    rows = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": t, "args": {"name": f"row {t}"}}
            for t in range(guidance.MAX_ROWS + 1)]
    path = _trace(tmp_path, [META, *rows])
    line = one_line(cli("perf-tool", "--trace", path, code=1))
    assert line == f"error: {path}: not a step timeline (more than {guidance.MAX_ROWS} rows)", line


# -- settings -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"buckets": "exp:0:"}, "option 'buckets': bucket policy 'exp:0:': whole numbers expected between the "
                            "separators"),
    ({"buckets": "exp:2:"}, "option 'buckets': bucket policy 'exp:2:': whole numbers expected"),
    ({"buckets": "list:64,8,16"}, "option 'buckets': bucket policy 'list:64,8,16': boundaries must increase"),
    ({"buckets": "exp:64:8"}, "option 'buckets': bucket policy 'exp:64:8': MIN 64 is above MAX 8"),
    ({"buckets": "lin:64:8"}, "option 'buckets': bucket policy 'lin:64:8': STEP 64 is above MAX 8"),
    ({"buckets": {"s0": "list:4,4"}}, "option 'buckets': bucket policy 'list:4,4': boundaries must increase"),
    ({"max_compound_op_size": 10e30}, "option 'max_compound_op_size' must be a whole number from 0 to 2147483647"),
    ({"max_compound_op_size": 10 ** 31}, "option 'max_compound_op_size' must be a whole number from 0 to "),
    ({"target": "gaudi9"}, "option 'target' must be one of gaudi2, gaudi3, got 'gaudi9'"),
    ({"bogus": 1}, "unknown hpu_backend option(s) ['bogus']; valid options: strict, target, "),
])
def test_bad_settings_are_one_line_naming_the_option(options, message):
    from hpu_backend.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as caught:
        Settings.from_options(options, env={})
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


def test_good_bucket_specs_still_parse():
    from hpu_backend.buckets import parse_policy

    assert [parse_policy(s).spec() for s in ("exp", "exp:2", "exp:2:64", "lin:8:64", "list:1,4,16", "exact")] == [
        "exp:1", "exp:2", "exp:2:64", "lin:8:64", "list:1,4,16", "exact"]
    assert parse_policy("list:1,4,16").bucket(5) == (5, 16)
