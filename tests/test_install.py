"""The installed package: every module ships, the console script runs, tests import the installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"hpu_backend": ROOT / "hpu_backend", "recipecache": ROOT / "recipecache",
           "hpurecipe": ROOT / "cli" / "hpurecipe"}


def _installed_modules() -> set[str]:
    files = metadata.files("hpu_backend") or []
    return {str(f) for f in files if str(f).endswith(".py")}


def test_every_source_module_is_in_the_distribution():
    installed = _installed_modules()
    if any(name.endswith("__editable__") or "__editable__" in name for name in installed):
        pytest.skip("editable install: the distribution lists a finder, not the modules")
    missing = [f"{pkg}/{path.relative_to(src)}" for pkg, src in SOURCES.items()
               for path in src.rglob("*.py") if f"{pkg}/{path.relative_to(src)}" not in installed]
    assert not missing, f"modules missing from the installed distribution: {missing}"


@pytest.mark.skipif(os.environ.get("PYTHONSAFEPATH") != "1", reason="only under CI's wheel install")
def test_tests_import_the_installed_copy():
    import hpu_backend
    import hpurecipe
    import recipecache

    for module in (hpu_backend, recipecache, hpurecipe):
        assert ROOT not in Path(module.__file__).resolve().parents, module.__file__


def test_console_script_runs():
    exe = shutil.which("hpurecipe")
    assert exe is not None, "the hpurecipe console script is not on PATH"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warm" in proc.stdout
