"""The installed package: every module ships, the console script runs, tests import the installed copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"hpu_backend": ROOT / "hpu_backend", "recipecache": ROOT / "recipecache",
           "hpurecipe": ROOT / "cli" / "hpurecipe"}


def _distribution() -> metadata.Distribution | None:
    """The distribution installed in this environment's site-packages (not an egg-info a build left in the
    checkout, which ``metadata.distribution`` would find first if the checkout were on ``sys.path``)."""
    site = sysconfig.get_paths()["purelib"]
    return next(iter(metadata.distributions(name="hpu_backend", path=[site])), None)


def _editable() -> bool:
    dist = _distribution()
    direct = (dist.read_text("direct_url.json") if dist else None) or "{}"
    return bool(json.loads(direct).get("dir_info", {}).get("editable"))


# The README's test command installs the wheel and keeps the source tree off sys.path
# (PYTHONSAFEPATH=1): then the tests must run the installed copy, with every module in it.
installed = pytest.mark.skipif(os.environ.get("PYTHONSAFEPATH") != "1" or _editable(),
                               reason="checks a wheel install tested with PYTHONSAFEPATH=1")


@installed
def test_every_source_module_is_in_the_distribution():
    dist = _distribution()
    assert dist is not None, "hpu_backend is not installed in this environment's site-packages"
    installed = {str(f) for f in dist.files or [] if str(f).endswith(".py")}
    missing = [f"{pkg}/{path.relative_to(src)}" for pkg, src in SOURCES.items()
               for path in src.rglob("*.py") if f"{pkg}/{path.relative_to(src)}" not in installed]
    assert not missing, f"modules missing from the installed distribution: {missing}"


@installed
def test_tests_import_the_installed_copy():
    import hpu_backend
    import hpurecipe
    import recipecache

    for module in (hpu_backend, recipecache, hpurecipe):
        package = Path(module.__file__).resolve().parent
        assert package != SOURCES[module.__name__].resolve(), f"{module.__name__} imported from the source tree"
        assert "site-packages" in package.parts, module.__file__


@pytest.mark.e2e
def test_console_script_runs():
    exe = shutil.which("hpurecipe")
    assert exe is not None, "the hpurecipe console script is not on PATH"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warm" in proc.stdout
