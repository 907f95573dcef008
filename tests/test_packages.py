"""Recipe packages: built by ``hpurecipe package``, served by ``load_package`` with no trace at all.

Every model in models/ is packaged once; a fresh process loads each package, serves every point of
the model file's axes and sizes between them, and compares with eager — without Dynamo ever being
imported. Calls outside the packaged buckets, damaged packages and packages from another toolchain
get one-line errors.
"""

from __future__ import annotations

import hashlib
import json
import re

import msgpack
import pytest
import torch

from cli_helpers import cli, cli_json, tiny_model
from conftest import MODELS as MODEL_DIR
from conftest import load_model_file, run_python
from hpu_backend import PackageError, load_package
from hpu_backend.modelfiles.modelfile import load_model_file as load_model
from hpu_backend.formats.package import HEADER_BYTES, MAGIC, UNSIGNED, read_package

MODELS = ("mnist", "gpt", "bert", "resnet")


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out = tmp_path_factory.mktemp("packages")
    for name in MODELS:
        cli("package", MODEL_DIR / f"{name}.py", "-o", out / f"{name}.hpkg", "--no-check")
    return out


SERVE = r"""
import itertools, json, sys
import torch
import hpu_backend
from hpu_backend.modelfiles.modelfile import load_model_file

out = {}
for name in sys.argv[1:]:
    spec = load_model_file(f"models/{name}.py")
    model = spec.make_model().eval()
    served = hpu_backend.load_package(f"{PACKAGES}/{name}.hpkg", model)
    # every point of the axes, and each value minus one (another place in a bucket, or another bucket)
    values = {a: sorted(set(vs) | {max(1, v - 1) for v in vs}) for a, vs in spec.axes.items()}
    points = [dict(zip(values, p)) for p in itertools.product(*values.values())]
    with torch.no_grad():
        for i, point in enumerate(points):
            inputs = spec.split(spec.make_inputs(**point, seed=1))
            torch.testing.assert_close(served(*inputs), model(*inputs))
            if i == 0:
                dynamo_after_first_call = "torch._dynamo" in sys.modules
    out[name] = {"points": len(points), "dynamo": dynamo_after_first_call}
out["dynamo_at_exit"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


@pytest.mark.e2e
def test_packages_serve_every_model_in_a_fresh_process_without_dynamo(packages):
    code = f"PACKAGES = {str(packages)!r}\n" + SERVE
    out = json.loads(run_python(f"import sys; sys.argv[1:] = {list(MODELS)!r}\n" + code).splitlines()[-1])
    for name in MODELS:
        assert out[name]["points"] >= 4 and out[name]["dynamo"] is False, (name, out[name])
    assert out["dynamo_at_exit"] is False


@pytest.fixture(scope="module")
def gpt(packages):
    module = load_model_file("gpt")
    model = module.make_model().eval()
    return module, model, load_package(packages / "gpt.hpkg", model)


@pytest.mark.e2e
def test_a_bucket_is_built_when_a_call_first_selects_it(packages):
    module = load_model_file("gpt")
    model = module.make_model().eval()
    served = load_package(packages / "gpt.hpkg", model)
    assert len(served.runs) > 1 and served.runs == [None] * len(served.runs)  # checked at load, none built
    tokens = module.make_inputs(1, 16)[0]
    with torch.no_grad():
        torch.testing.assert_close(served(tokens), model(tokens))
    assert sum(run is not None for run in served.runs) == 1  # only the bucket that call needed


@pytest.mark.e2e
def test_a_call_outside_the_buckets_names_the_input_and_the_range(gpt):
    module, _, served = gpt
    with pytest.raises(PackageError) as e:
        served(module.make_inputs(2, 300)[0])
    message = str(e.value)
    assert "\n" not in message
    assert "'tokens' dim 1 = 300" in message and "65-128" in message


@pytest.mark.e2e
def test_a_call_with_another_layout_is_refused(gpt):
    module, _, served = gpt
    tokens, targets = module.make_inputs(2, 16)
    with pytest.raises(PackageError, match="takes 1 positional argument"):
        served(tokens, targets)


def test_the_package_runs_with_the_models_current_weights(gpt):
    module, model, served = gpt
    tokens = module.make_inputs(2, 24)[0]
    with torch.no_grad():
        model.head.weight.mul_(2)
        try:
            torch.testing.assert_close(served(tokens), model(tokens))
        finally:
            model.head.weight.div_(2)


def test_weights_stored_in_the_package_need_no_model(tmp_path):
    path = tmp_path / "tiny.hpkg"
    result = cli("package", tiny_model(tmp_path), "-o", path, "--with-weights")
    assert "matches eager at 2 points" in result.output
    module = load_model(tmp_path / "tiny.py")
    x = module.make_inputs(5, seed=3)[0]
    with torch.no_grad():
        torch.testing.assert_close(load_package(path)(x), module.make_model()(x))


def test_a_package_without_weights_asks_for_the_model(packages):
    with pytest.raises(PackageError, match="pass the model"):
        load_package(packages / "mnist.hpkg")


def _rewrite(src, dst, change) -> None:
    """A copy of a package with its payload changed and the checksum made valid again."""
    data = src.read_bytes()
    raw = msgpack.unpackb(data[HEADER_BYTES:], raw=False)
    change(raw)
    payload = msgpack.packb(raw, use_bin_type=True)
    dst.write_bytes(MAGIC + hashlib.sha256(payload).digest() + UNSIGNED + payload)


def _first_node(raw):
    return raw["recipes"][0]["nodes"][0]


@pytest.mark.parametrize("damage", [
    pytest.param(lambda p, d: d.write_bytes(p.read_bytes()[:2000]), id="truncated"),
    pytest.param(lambda p, d: d.write_bytes(p.read_bytes()[:-10] + b"\0" * 10), id="bytes-changed"),
    pytest.param(lambda p, d: d.write_bytes(b"not a package"), id="not-a-package"),
    pytest.param(lambda p, d: _rewrite(p, d, lambda r: r["recipes"][0].update(nodes="oops")), id="malformed"),
    pytest.param(lambda p, d: _rewrite(p, d, lambda r: _first_node(r).update(op="aten::_print")), id="bad-op"),
    pytest.param(lambda p, d: _rewrite(p, d, lambda r: r["inputs"].pop()), id="inputs-mismatch"),
])
def test_a_damaged_package_is_refused_in_one_line(packages, tmp_path, damage):
    bad = tmp_path / "bad.hpkg"
    damage(packages / "mnist.hpkg", bad)
    model = load_model_file("mnist").make_model().eval()
    with pytest.raises(PackageError) as e:
        load_package(bad, model)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
    result = cli("verify", bad, code=1)
    assert result.output.strip() and "Traceback" not in result.output


def test_a_package_from_another_toolchain_is_refused_naming_both(packages, tmp_path):
    other = tmp_path / "other.hpkg"
    _rewrite(packages / "mnist.hpkg", other, lambda r: r["toolchain"].update(torch="2.0.0"))
    with pytest.raises(PackageError, match=r"built with torch=2\.0\.0 .*this is torch=" + re.escape(torch.__version__)):
        load_package(other, load_model_file("mnist").make_model().eval())


def test_show_ls_and_verify_read_a_package(packages):
    path = str(packages / "gpt.hpkg")
    doc = cli_json("show", path)
    assert doc["kind"] == "package" and doc["model"] == "gpt" and len(doc["buckets"]) == 4
    assert doc["ranges"] == {"s0": [1, 16], "s1": [1, 128]}
    listed = cli_json("ls", path)
    assert [b["bucket"]["s1"] for b in listed] == [[0, 16], [17, 32], [33, 64], [65, 128]]
    assert "all 4 recipes load" in cli("verify", path).output


HF_GPT2 = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel

def make_model():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)

def make_inputs(batch, seq, seed=0):
    return (torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(seed)),)

AXES = {"batch": [2], "seq": [8, 16]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:8"}}
'''

TIED = '''
import torch

class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two names

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))

def make_model():
    torch.manual_seed(0)
    return Tied()

def make_inputs(batch, seed=0):
    return (torch.randint(0, 32, (batch, 4), generator=torch.Generator().manual_seed(seed)),)

AXES = {"batch": [2, 8]}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:2"}}
'''


def _serves_tied_weights(path, module, inputs, tied):
    """The package follows the model's shared tensor (changed under one name), and stored weights serve alone."""
    model = module.make_model().eval()
    served = load_package(path, model)
    with torch.no_grad():
        torch.testing.assert_close(served(*inputs), model(*inputs))
        tied(model).mul_(1.5)
        torch.testing.assert_close(served(*inputs), model(*inputs))


@pytest.mark.e2e
def test_a_model_with_tied_weights_packages_with_and_without_weights(tmp_path):
    path = tmp_path / "tied.hpkg"
    cli("package", tiny_model(tmp_path, "tied", TIED), "-o", path)
    module = load_model(tmp_path / "tied.py")
    _serves_tied_weights(path, module, module.make_inputs(5, seed=2), lambda m: m.head.weight)
    cli("package", tmp_path / "tied.py", "-o", path, "--with-weights")
    model, inputs = module.make_model().eval(), module.make_inputs(6, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(load_package(path)(*inputs), model(*inputs))
    assert list(read_package(path).weights) == ["embed.weight"]  # the shared tensor is stored once


@pytest.mark.e2e
def test_hugging_face_gpt2_packages_its_tied_lm_head(tmp_path):
    path = tmp_path / "gpt2.hpkg"
    result = cli("package", tiny_model(tmp_path, "gpt2", HF_GPT2), "-o", path, "--with-weights")
    assert "matches eager at 2 points" in result.output
    module = load_model(tmp_path / "gpt2.py")
    inputs = module.make_inputs(2, 12, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(load_package(path)(*inputs).logits, module.make_model().eval()(*inputs).logits)
    _serves_tied_weights(path, module, inputs, lambda m: m.lm_head.weight)


NOISY = '''
import torch

def make_model():
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)  # never matches eager
    return Noisy()

def make_inputs(batch, seed=0):
    return (torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed)),)

AXES = {"batch": [2, 8]}
COMPILE = {"dynamic": True, "options": {}}
'''


def test_a_failed_package_leaves_no_file_behind(tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # package writes into a directory that exists, never one it makes
    result = cli("package", tiny_model(tmp_path, "noisy", NOISY), "-o", out / "noisy.hpkg", code=1)
    assert "does not match eager" in result.output
    assert list(out.iterdir()) == []


STRIDED_CNN = '''
import torch
import torch.nn as nn

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))

def make_inputs(batch, size, seed=0):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed)),)

AXES = {"batch": [2], "size": SIZES}
COMPILE = {"dynamic": True, "options": {"buckets": "exp:2"}}
'''


def _strided_cnn(tmp_path, sizes, extra=""):
    return tiny_model(tmp_path, "cnn", STRIDED_CNN.replace("SIZES", repr(sizes)) + extra)


@pytest.mark.e2e
def test_a_strided_cnn_packages_from_the_bottom_of_its_smallest_bucket(tmp_path):
    # from 1, export fails: the convolutions need 7 pixels and specialize 7-10; the points' buckets start at 17
    path = tmp_path / "cnn.hpkg"
    cli("package", _strided_cnn(tmp_path, [32, 64]), "-o", path)
    assert read_package(path).ranges == {"s0": [17, 64]}
    module = load_model(tmp_path / "cnn.py")
    model = module.make_model().eval()
    served = load_package(path, model)
    with torch.no_grad():
        for size in (17, 40):
            torch.testing.assert_close(served(*module.make_inputs(2, size)), model(*module.make_inputs(2, size)))
    with pytest.raises(PackageError, match="dim 2 = 16 is outside the packaged buckets"):
        served(*module.make_inputs(2, 16))


def test_the_model_file_sets_an_axis_smallest_packaged_size(tmp_path):
    path = tmp_path / "cnn.hpkg"
    cli("package", _strided_cnn(tmp_path, [32, 64], 'AXES_MIN = {"size": 24}\n'), "-o", path, "--no-check")
    assert read_package(path).ranges == {"s0": [24, 64]}


def test_an_unexportable_axis_passes_on_torchs_whole_reason_and_what_to_do(tmp_path):
    result = cli("package", _strided_cnn(tmp_path, [4, 8]), "-o", tmp_path / "cnn.hpkg", code=1)
    assert "Constraints violated" in result.output and "Suggested fixes" in result.output  # beyond its first line
    assert "narrowest bounds tried: size 4-8" in result.output and 'AXES_MIN = {"size": N}' in result.output
    assert not (tmp_path / "cnn.hpkg").exists()
