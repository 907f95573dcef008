"""CPU fallback reporting in the bridge's format (real subprocesses), metrics, and strict mode."""

from __future__ import annotations

import pytest
import torch

from hpu_backend.serve import fallback
from hpu_backend.metrics import metric_localcontext
from hpu_backend.formats.recipe import Recipe
from conftest import ROOT

DIGAMMA = """
import torch
def f(x):
    return torch.special.digamma(x) * 2
x = torch.rand(8, dtype=torch.bfloat16) + 0.5
compiled = torch.compile(f, backend="hpu_backend", options={"cache": False})
for _ in range(2):  # two executions of one recipe: the bridge's table counts both
    torch.testing.assert_close(compiled(x), f(x))
print("RESULT OK")
"""


def _run(env: dict) -> tuple[str, str]:
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", DIGAMMA], capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT), env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


@pytest.mark.e2e
def test_fallback_line_and_exit_table_on_the_console():
    out, err = _run({"LOG_LEVEL_PT_FALLBACK": "1", "ENABLE_CONSOLE": "true"})
    console = out + err
    assert "RESULT OK" in out
    assert console.count("CPU fallback digamma : self=HPUBFloat16Type") == 1  # once, when the recipe is taken up
    table = console[console.index(fallback.HEADER):].splitlines()
    assert table[:2] == [fallback.HEADER, "2       aten::digamma"]
    assert console.index("CPU fallback digamma") < console.index(fallback.HEADER)


def test_no_fallback_output_without_the_log_level(capsys, monkeypatch):
    monkeypatch.setattr(fallback, "_exit_registered", True)  # no exit-time table from this process
    recipe = Recipe(name="g", kind="inference", target="gaudi2", inputs=[], input_names=[], nodes=[], outputs=[],
                    facts={"placement": {"fallbacks": [{"op": "aten::digamma", "dtypes": ["bfloat16"],
                                                        "line": "CPU fallback digamma : self=HPUBFloat16Type"}]}})
    fallback.report(recipe, env={"ENABLE_CONSOLE": "true"})
    assert capsys.readouterr().err == ""
    fallback.report(recipe, env={"ENABLE_CONSOLE": "true", "LOG_LEVEL_PT_FALLBACK": "1"})
    assert capsys.readouterr().err == "CPU fallback digamma : self=HPUBFloat16Type\n"


def test_fallbacks_feed_the_cpu_fallback_metric_per_execution():
    x = torch.rand(8, dtype=torch.bfloat16) + 0.5
    fn = torch.compile(lambda t: torch.special.digamma(t) + torch.special.digamma(t * 2), backend="hpu_backend",
                       options={"cache": False})
    recipes_before, runs_before = fallback.recipe_counts()["aten::digamma"], fallback.counts()["aten::digamma"]
    with metric_localcontext("cpu_fallback") as m:
        for _ in range(3):
            fn(x)
    stats = dict(m.stats())
    # Two digamma nodes in one recipe, executed three times: six fallback executions, one recipe.
    assert stats["TotalNumber"] == 6 and stats["FallbackOps"] == {"aten::digamma": 6}
    assert fallback.counts()["aten::digamma"] - runs_before == 6
    assert fallback.recipe_counts()["aten::digamma"] - recipes_before == 2


def test_a_compile_only_run_counts_no_fallback_execution():
    x = torch.rand(8, dtype=torch.bfloat16) + 0.5
    fn = torch.compile(lambda t: torch.special.digamma(t) + 1, backend="hpu_backend",
                       options={"cache": False, "execute": False})
    with metric_localcontext("cpu_fallback") as m:
        fn(x)
    assert dict(m.stats())["TotalNumber"] == 0


def test_strict_mode_raises_naming_the_op():
    x = torch.rand(8, dtype=torch.bfloat16) + 0.5
    fn = torch.compile(lambda t: torch.special.digamma(t) + 1, backend="hpu_backend",
                       options={"strict": True, "cache": False})
    with pytest.raises(Exception, match=r"aten::digamma \(bfloat16\).*strict"):
        fn(x)


def test_frequency_table_format_and_enabled_levels():
    assert fallback.frequency_table({"aten::digamma": 1, "aten::lgamma": 3}).splitlines() == [
        fallback.HEADER, "3       aten::lgamma", "1       aten::digamma"]
    assert fallback.enabled({"LOG_LEVEL_PT_FALLBACK": "1"}) and fallback.enabled({"LOG_LEVEL_ALL": "0"})
    assert not fallback.enabled({"LOG_LEVEL_PT_FALLBACK": "3"}) and not fallback.enabled({})
