"""What a new user meets at the command line: usage errors as one line, values refused before any model loads,
destinations that are never made up, plans refused against the model's context length."""

from __future__ import annotations

import pytest

from cli_helpers import TINY, cli, one_line, tiny_model

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
