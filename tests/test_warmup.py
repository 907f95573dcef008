"""The model-file loader and ``hpu_backend.warmup`` for serving processes (tiny model, real caches)."""

from __future__ import annotations

import types

import pytest
import torch
import torch._dynamo

import hpu_backend
from hpu_backend.metrics import metric_localcontext
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.modelfiles.modelspec import ModelFileError, spec_from

from cli_helpers import TINY, cli, tiny_model
from conftest import MODELS


def compiled_tiny(spec, cache_dir):
    options = dict(spec.options, cache_config=f"{cache_dir},false,100")
    return torch.compile(spec.make_model(), backend="hpu_backend", dynamic=spec.dynamic, options=options)


def test_every_model_file_in_models_loads():
    for path in sorted(MODELS.glob("*.py")):
        spec = load_model_file(path)
        assert spec.name == path.stem and spec.points() and callable(spec.make_model)


def test_selector_names_an_object_holding_the_spec(tmp_path):
    text = TINY + "\nclass Small:\n    make_model = staticmethod(make_model)\n" \
                  "    make_inputs = staticmethod(make_inputs)\n    AXES = {'batch': [3]}\n    COMPILE = COMPILE\n"
    path = tiny_model(tmp_path, "holder", text)
    assert load_model_file(f"{path}:Small").axes == {"batch": [3]}
    with pytest.raises(ModelFileError, match="no attribute 'Big'"):
        load_model_file(f"{path}:Big")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("AXES = ", "XAXES = "), "missing AXES"),
    (lambda t: t.replace('"buckets": "exp:2"', '"bucketz": 1'), "unknown hpu_backend option"),
    (lambda t: t.replace('{"batch": [2, 8]}', '{"batch": []}'), "AXES must map"),
    (lambda t: t.replace("def make_inputs(batch, seed=0)", "def make_inputs(size, seed=0)"), "must accept the axes"),
    (lambda t: t + "\nraise RuntimeError('boom')\n", "failed to import: it raised RuntimeError: boom"),
    (lambda t: t + '\nAXES_MIN = {"batch": 3}\n', "AXES_MIN must map axes"),  # above the axis's smallest value
    (lambda t: t + '\nAXES_MIN = {"size": 1}\n', "AXES_MIN must map axes"),
])
def test_a_bad_model_file_is_one_line_naming_the_problem(tmp_path, edit, message):
    path = tiny_model(tmp_path, "bad", edit(TINY))
    with pytest.raises(ModelFileError, match=message) as info:
        load_model_file(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_spec_from_a_namespace_or_dict():
    ns = types.SimpleNamespace(make_model=lambda: torch.nn.Linear(2, 2), make_inputs=lambda n, seed=0: (torch.ones(n,
                                                                                                                   2),),
                               AXES={"n": [1, 2]}, COMPILE={"dynamic": False})
    assert spec_from(ns, "ns").points() == [{"n": 1}, {"n": 2}]
    assert spec_from(vars(ns), "dict").axes == {"n": [1, 2]}


def test_warmup_loads_every_bucket_from_disk_before_serving(tmp_path):
    path = tiny_model(tmp_path)
    cli("warm", path, "-d", tmp_path / "c")
    torch._dynamo.reset()
    spec = load_model_file(path)
    compiled = compiled_tiny(spec, tmp_path / "c")
    with metric_localcontext("graph_compilation") as gc:
        report = hpu_backend.warmup(compiled, str(path))
        with torch.no_grad():
            for point in spec.points():
                compiled(*spec.split(spec.make_inputs(**point)))
    assert dict(gc.stats())["TotalNumber"] == 0
    assert report.summary()["buckets"] == 2 and report.summary()["compiled"] == 0 and report.summary()["hits"] == 2


def test_warmup_reports_what_an_already_serving_model_uses(tmp_path):
    spec = load_model_file(tiny_model(tmp_path))
    compiled = compiled_tiny(spec, tmp_path / "c")
    first = hpu_backend.warmup(compiled, spec)
    again = hpu_backend.warmup(compiled, spec, axes={"batch": [5, 8]})
    assert first.summary()["compiled"] == 2
    assert again.summary()["compiled"] == 0 and again.summary()["recipes"] == 1
    assert again.points[0].keys == first.points[1].keys  # 5 and 8 share the bucket 5-8


def test_a_warm_of_some_axis_values_adds_to_the_manifest(tmp_path):
    from hpu_backend.shipping.manifests import read_manifests

    path = tiny_model(tmp_path)
    cli("warm", path, "-d", tmp_path / "c")
    cli("warm", path, "-d", tmp_path / "c", "--axis", "batch=3")
    (doc,) = read_manifests(tmp_path / "c")
    assert set(doc["buckets"]) == {"batch=2", "batch=3", "batch=8"}


def test_the_library_warm_writes_the_manifest_and_checks_the_cache_kept_it(tmp_path):
    from hpu_backend.shipping.manifests import read_manifests
    from hpu_backend.shipping.warm import warm
    from recipecache import CacheConfig

    spec = load_model_file(tiny_model(tmp_path))
    report = warm(spec, CacheConfig(path=tmp_path / "c", max_size_mb=64))
    (doc,) = read_manifests(tmp_path / "c")
    assert report.manifest == str(tmp_path / "c" / "manifests" / "tiny.inference.json") and not report.warnings
    assert sorted({k for ks in doc["buckets"].values() for k in ks}) == sorted(
        {k for p in report.points for k in p.keys + p.programs})
    assert report.fit.fits and report.fit.needed == 3
