"""hpurecipe on models/gpt.py in real processes: warm, then serve with no compilation; ship a cache to an empty one."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo

from hpu_backend.metrics import metric_localcontext
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.shipping.manifests import read_manifests

from cli_helpers import cli, cli_json, cli_process
from conftest import MODELS, run_python

pytestmark = pytest.mark.e2e  # the end-to-end tier (the e2e marker in pyproject.toml)

GPT = MODELS / "gpt.py"
# Few buckets keep the tests quick; batch 1 and 2 still give two Dynamo graphs (batch 1 is specialized).
AXES = {"batch": [1, 2], "seq": [16, 32]}
AXIS_ARGS = ["--axis", "batch=1,2", "--axis", "seq=16,32"]


def manifest_keys(cache_dir) -> set[str]:
    (doc,) = read_manifests(cache_dir)
    return {k for keys in doc["buckets"].values() for k in keys}


@pytest.fixture(scope="module")
def gpt_cache(tmp_path_factory):
    """A cache warmed by `hpurecipe warm models/gpt.py` in its own process."""
    cache = tmp_path_factory.mktemp("gpt") / "cache"
    doc = cli_process("warm", GPT, "--cache-dir", cache, *AXIS_ARGS)
    assert doc["buckets"] == 4 and doc["compiled"] == doc["recipes"] == 4
    return cache


SERVE = """
import json, torch, hpu_backend
from hpu_backend.metrics import metric_global
spec = hpu_backend.load_model_file("models/gpt.py").with_axes({axes})
model = torch.compile(spec.make_model().eval(), backend="hpu_backend", dynamic=spec.dynamic,
                      options=dict(spec.options, cache_config="{cache},false,1024"))
with torch.no_grad():
    for point in spec.points():
        model(*spec.split(spec.make_inputs(**point)))
print(json.dumps({{"compile": dict(metric_global("graph_compilation").stats()),
                  "cache": dict(metric_global("recipe_cache").stats())}}))
"""


def test_serving_after_warm_compiles_nothing(gpt_cache):
    doc = json.loads(run_python(SERVE.format(cache=gpt_cache, axes=AXES)).strip().splitlines()[-1])
    assert doc["compile"]["TotalNumber"] == 0
    cache = doc["cache"]
    assert cache["TotalMiss"] == 0 and cache["ProgramMiss"] == 0  # no recipe lowered, no graph traced by AOT
    assert cache["TotalHit"] + cache["ProgramHit"] == len(manifest_keys(gpt_cache))  # recipes + programs


def test_export_import_coverage_then_zero_compilations(tmp_path, gpt_cache):
    bundle = tmp_path / "gpt.tar"
    cli("export", bundle, "--cache-dir", gpt_cache, "--model", "gpt")
    target = tmp_path / "imported"
    assert cli_json("import", bundle, "--cache-dir", target)["imported"] == len(manifest_keys(gpt_cache))
    # In a fresh process, as the warm-up was: this worker may hold the hpu device (the device tests enable it at
    # import), under which Dynamo retraces a recompile's restart once more and keys one more (empty) program.
    assert cli_process("coverage", GPT, "--cache-dir", target, *AXIS_ARGS)["uncovered"] == []
    torch._dynamo.reset()
    spec = load_model_file(GPT).with_axes(AXES)
    model = torch.compile(spec.make_model().eval(), backend="hpu_backend", dynamic=spec.dynamic,
                          options=dict(spec.options, cache_config=f"{target},false,1024"))
    with metric_localcontext("graph_compilation") as gc, torch.no_grad():
        for point in spec.points():
            model(*spec.split(spec.make_inputs(**point)))
    assert dict(gc.stats())["TotalNumber"] == 0
