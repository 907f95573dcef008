"""Shared fixtures: a private recipe cache per test session, a fresh Dynamo per test, model loading."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep every test away from the user's cache directory."""
    path = tmp_path_factory.mktemp("recipes")
    old = os.environ.get("PT_HPU_RECIPE_CACHE_CONFIG")
    os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] = f"{path},false,1024"
    yield path
    if old is None:
        os.environ.pop("PT_HPU_RECIPE_CACHE_CONFIG", None)
    else:
        os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] = old


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def load_model_file(name: str):
    """Import models/<name>.py as a module (model files are plain scripts, not a package)."""
    path = MODELS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"hpu_models_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_python(code: str, env: dict | None = None, timeout: int = 300) -> str:
    """Run code in a fresh interpreter; return stdout, fail the test with stderr on error."""
    import subprocess

    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout
