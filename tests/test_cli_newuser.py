"""What a new user meets at the command line: usage errors as one line, values refused before any model loads,
destinations that are never made up, plans refused against the model's context length, Ctrl-C during warm."""

from __future__ import annotations

import signal
import subprocess
import sys
import warnings

import pytest

from cli_helpers import TINY, cli, cli_json, one_line, tiny_model

# A model file that leaves a mark when it is loaded: a check "at parse time" must not leave one.
MARKED = TINY + '''
import pathlib
pathlib.Path(__file__).with_suffix(".loaded").touch()
'''


@pytest.mark.parametrize("args, says", [
    (["warm"], "Missing argument 'model_file'. (see hpurecipe warm --help)"),
    (["ls", "--bogus"], "No such option: --bogus (see hpurecipe ls --help)"),
    (["frobnicate"], "No such command 'frobnicate'. (see hpurecipe --help)"),
    (["analyze", "m.py", "--zero", "x"], "Invalid value for '--zero'"),
], ids=["missing-argument", "unknown-option", "unknown-command", "not-an-integer"])
def test_usage_errors_are_one_line_not_a_box(args, says):
    line = one_line(cli(*args, code=2))
    assert line.startswith("error: ") and says in line and "─" not in line and "│" not in line, line


@pytest.mark.parametrize("args, says", [
    (["--zero", "5"], "--zero 5: expected an integer from 0 to 3"),
    (["--tp", "3", "--cards", "8"], "--tp 3 does not divide --cards 8"),
    (["--cards", "1000000"], "--cards 1000000: expected a positive integer, at most 1,024"),
    (["--cards", "16"], "--cards 16: a gaudi2 server joins 1 to 8 cards"),
    (["--global-batch", "7", "--cards", "8"], "global batch 7 does not split over 8 data-parallel cards"),
], ids=["zero", "tp", "cards-huge", "cards-server", "global-batch"])
def test_plan_values_are_refused_before_the_model_file_loads(tmp_path, args, says):
    model = tiny_model(tmp_path, text=MARKED)
    line = one_line(cli("analyze", model, "--train", "--seq", "16", "--global-batch", "64", *args, code=2))
    assert line.startswith("error: ") and says in line, line
    assert not model.with_suffix(".loaded").exists()


def test_package_to_a_missing_directory_is_refused_and_nothing_is_made(tmp_path):
    model = tiny_model(tmp_path, text=MARKED)
    dest = tmp_path / "no" / "such" / "dir" / "x.hpkg"
    line = one_line(cli("package", model, "-o", dest, code=1))
    assert line == f"error: cannot write {dest}: there is no directory {dest.parent}", line
    assert not (tmp_path / "no").exists() and not model.with_suffix(".loaded").exists()


def test_plans_longer_than_the_models_context_are_refused_before_tracing(tmp_path):
    model = tiny_model(tmp_path, text=TINY.replace("MODEL_INPUTS = 1", "MODEL_INPUTS = 1\nCONTEXT = 64"))
    line = one_line(cli("analyze", model, "--input-len", "60", "--output-len", "8", code=1))
    assert "--input-len 60 + --output-len 8 = 68 tokens" in line and "at most 64 tokens" in line, line
    line = one_line(cli("analyze", model, "--train", "--seq", "65", "--global-batch", "8", code=1))
    assert "--seq 65 = 65 tokens" in line and "at most 64 tokens" in line, line
    bad = tiny_model(tmp_path, "bad", TINY + "\nCONTEXT = 0\n")
    assert "CONTEXT must be a positive integer" in one_line(cli("analyze", bad, "--input-len", "8",
                                                                  "--output-len", "8", code=1))


WAITS = TINY.replace("def make_inputs(batch, seed=0):\n", '''def make_inputs(batch, seed=0):
    if batch == 8:  # the second point, once the first one's recipes are written: wait for Ctrl-C
        print("waiting", flush=True)
        import time
        time.sleep(300)
''')


@pytest.mark.e2e
def test_ctrl_c_during_warm_says_what_was_written_and_that_the_cache_verifies(tmp_path):
    model, cache = tiny_model(tmp_path, text=WAITS), tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "hpurecipe.main", "warm", str(model), "-d", str(cache)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.strip() == "waiting":
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    recipes = [r for r in cli_json("ls", "-d", cache) if r["kind"] != "program"]
    assert proc.returncode == 130 and recipes, (proc.returncode, err)
    assert err.splitlines() == [f"interrupted: {len(recipes)} recipe{'s' * (len(recipes) > 1)} written, "
                                "the cache verifies clean"], err
    assert cli_json("verify", "-d", cache)["bad"] == 0


def test_the_anomaly_trace_is_dropped_after_ctrl_c_and_kept_otherwise():
    from hpurecipe.buildcmds import interrupt_quiet

    shown = []
    trace = "Error detected in AddmmBackward0. Traceback of forward call that caused the error:"
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        with pytest.raises(KeyboardInterrupt), interrupt_quiet():
            warnings.warn(trace)
            raise KeyboardInterrupt
        assert shown == []
        with interrupt_quiet():
            warnings.warn(trace)
            warnings.warn("another warning")
            assert shown == ["another warning"]  # the trace waits for the end of the run
    assert shown == ["another warning", trace]


def _advise_stages(monkeypatch, console_file, terminal: bool) -> list:
    """Run ``advise`` with a stand-in planner that reports two stages and stops; what it was handed."""
    import hpu_backend.diagnosis.advise as advise_module
    from rich.console import Console

    from hpu_backend.modelfiles.modelspec import ModelFileError
    from hpurecipe import render

    handed = []

    def planner(spec, train, target, on_step=None):
        handed.append(on_step)
        if on_step is not None:
            on_step("stage one")
            on_step("stage two")
        raise ModelFileError("stopped after the stages")

    monkeypatch.setattr(advise_module, "advise", planner)
    monkeypatch.setattr(render, "err_console", Console(file=console_file, force_terminal=terminal, width=200))
    return handed


@pytest.mark.parametrize("terminal, json, shown", [(True, False, True), (False, False, False), (True, True, False)],
                         ids=["terminal", "not-a-terminal", "json"])
def test_long_plans_show_their_stage_on_a_terminal_only(monkeypatch, tmp_path, terminal, json, shown):
    import io

    out = io.StringIO()
    handed = _advise_stages(monkeypatch, out, terminal)
    cli("advise", tiny_model(tmp_path), *(["--json"] if json else []), code=1)
    assert (handed[0] is not None) == shown
    text = out.getvalue()
    assert ("advise" in text and "stage one" in text and "stage two" in text) == shown, text
