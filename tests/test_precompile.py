"""Precompiled artifacts: torch's aot_compile with hpu_backend, saved signed, served in a new process with no trace.

One directory is precompiled per module (the tiny model file, signed); a fresh process serves it and counts
Dynamo, AOTAutograd and lowering activity. The trust tests use an artifact whose pickle would create a file:
it must be refused before torch's unpickler sees it.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import msgpack
import pytest
import torch

import hpu_backend
from hpu_backend.formats.precompiled import (MANIFEST, PrecompileError, artifact_bytes, framed, inflate,
                                             manifest_bytes, read_artifact)
from hpu_backend.serve.precompiled import PrecompiledGraph, accelerator
from recipecache.signing import key_id, key_path, own_signer
from cli_helpers import TINY, cli, one_line, tiny_model

ROOT = Path(__file__).resolve().parent.parent
KEY = "precompile-test-key"


@pytest.fixture(scope="module")
def signed_key():
    old = os.environ.get("HPURECIPE_BUNDLE_KEY")
    os.environ["HPURECIPE_BUNDLE_KEY"] = KEY
    yield KEY
    if old is None:
        os.environ.pop("HPURECIPE_BUNDLE_KEY")
    else:
        os.environ["HPURECIPE_BUNDLE_KEY"] = old


@pytest.fixture(scope="module")
def precompiled(tmp_path_factory, signed_key):
    """(model file, directory): the tiny model precompiled over batch 2 and 8, signed."""
    root = tmp_path_factory.mktemp("precompiled")
    model_file = tiny_model(root)
    # Built in a fresh process, as a deployment builds it: a worker of this suite may have the hpu device
    # enabled, and Dynamo's guards would then ask for an accelerator that the serving process does not have.
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'cli'}")
    proc = subprocess.run([sys.executable, "-m", "hpurecipe.main", "precompile", str(model_file), "-o",
                           str(root / "tiny.precompiled")], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model_file, root / "tiny.precompiled"


def _copy(directory: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(directory, tmp_path / "copy"))


CHILD = r"""
import json, sys
import torch
import torch._functorch.aot_autograd as aot
import torch._dynamo.convert_frame as cf
import hpu_backend
from hpu_backend.metrics import metric_global

counts = {"aot_traces": 0, "dynamo_traces": 0}
def counting(name, fn):
    def wrapped(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)
    return wrapped
aot.aot_stage1_graph_capture = counting("aot_traces", aot.aot_stage1_graph_capture)
cf._compile = counting("dynamo_traces", cf._compile)
cf.fullgraph_capture = counting("dynamo_traces", cf.fullgraph_capture)

spec = hpu_backend.load_model_file(sys.argv[1])
model = spec.make_model().eval()
served = hpu_backend.load_precompiled(sys.argv[2], model)
for point in spec.points():
    inputs = spec.split(spec.inputs(point, seed=3))
    with torch.no_grad():
        torch.testing.assert_close(served(*inputs), model(*inputs))
cache = dict(metric_global("recipe_cache").stats())
counts.update(lowered=dict(metric_global("graph_compilation").stats())["TotalNumber"],
              recipe_misses=cache["TotalMiss"], recipe_hits=cache["TotalHit"],
              dynamo_frames=sum(torch._dynamo.utils.counters["frames"].values()))
print(json.dumps(counts))
"""


@pytest.mark.e2e
def test_a_new_process_serves_every_bucket_matching_eager_without_tracing_or_lowering(precompiled, tmp_path):
    model_file, directory = precompiled
    env = dict(os.environ, PT_HPU_RECIPE_CACHE_CONFIG=f"{tmp_path / 'empty-cache'},false,64",
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'cli'}")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model_file), str(directory)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["recipe_hits"] == 2, counts  # both buckets served, from the artifact (the cache is empty)
    assert counts == dict(counts, aot_traces=0, dynamo_traces=0, dynamo_frames=0, lowered=0, recipe_misses=0)


@pytest.mark.e2e
def test_a_call_outside_every_precompiled_range_falls_back_to_torch_compile_with_one_warning(precompiled, caplog):
    model_file, directory = precompiled
    spec = hpu_backend.load_model_file(str(model_file))
    model = spec.make_model().eval()
    served = hpu_backend.load_precompiled(directory, model)
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for seed in (1, 2):  # batch 1: Dynamo specializes size 1, so the batch>=2 artifact's guard fails
            x, _ = spec.inputs({"batch": 1}, seed=seed)
            with torch.no_grad():
                torch.testing.assert_close(served(x), model(x))
    warnings = [r.getMessage() for r in caplog.records if "no artifact accepts" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "range-000.hpuaot: batch=1 is outside batch=2,5..8" in warnings[0], warnings[0]  # the guard that failed


def _evil_pickle(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))
    return pickle.dumps(Evil())


def _info(directory: Path) -> dict:
    return read_artifact(directory / "range-000.hpuaot").info


@pytest.mark.e2e
def test_an_unsigned_forged_or_tampered_artifact_is_refused_before_unpickling(precompiled, tmp_path):
    model_file, directory = precompiled
    marker = tmp_path / "pickle-ran"
    evil = _evil_pickle(marker)
    pickle.loads(evil)  # the payload is live: unpickled, it creates the file
    assert marker.exists()
    marker.unlink()
    copy = _copy(directory, tmp_path)
    info = _info(copy)
    model = hpu_backend.load_model_file(str(model_file)).make_model()
    artifact = copy / "range-000.hpuaot"
    genuine = artifact.read_bytes()
    other = dict(info, signer={"kind": "machine", "id": "0123abcd"})
    for data, expected in ((artifact_bytes(info, evil, None), "not signed, and unsigned precompiled files are never "
                                                              "loaded"),
                           (artifact_bytes(info, evil, b"another key"), "the signature does not match: changed after "
                                                                        "signing"),
                           (artifact_bytes(other, evil, b"another key"), re.escape(
                               "signed with a machine's own key (id 0123abcd), not with HPURECIPE_BUNDLE_KEY (id ")
                            + ".*precompile it here, or set the same team key HPURECIPE_BUNDLE_KEY"),
                           (genuine[:-1] + bytes([genuine[-1] ^ 1]), "checksum mismatch"),
                           (genuine[:len(genuine) // 2], "checksum mismatch")):
        artifact.write_bytes(data)
        with pytest.raises(PrecompileError, match=expected) as e:
            hpu_backend.load_precompiled(copy, model)
        assert "\n" not in str(e.value)
        assert not marker.exists()


@pytest.mark.e2e
def test_an_artifact_is_unpickled_when_a_call_first_reaches_it_and_a_signed_bad_one_is_refused_then(
        precompiled, tmp_path):
    model_file, directory = precompiled
    spec = hpu_backend.load_model_file(str(model_file))
    model = spec.make_model().eval()
    served = hpu_backend.load_precompiled(directory, model)
    assert [a._fn for a in served.functions] == [None]  # checked at load, not unpickled yet
    first = spec.points()[0]
    inputs = spec.split(spec.inputs(first, seed=1))
    with torch.no_grad():
        torch.testing.assert_close(served(*inputs), model(*inputs))
    assert served.functions[0]._fn is not None  # unpickled by the call that reached it
    copy = _copy(directory, tmp_path)
    artifact = copy / "range-000.hpuaot"
    artifact.write_bytes(artifact_bytes(_info(copy), pickle.dumps(["not torch's"]), KEY.encode()))
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["manifest"]["artifacts"][0]["sha256"] = read_artifact(artifact).digest
    (copy / MANIFEST).write_bytes(manifest_bytes(manifest["manifest"], KEY.encode()))
    bad = hpu_backend.load_precompiled(copy, model)  # signed and listed: torch reads it at the first call
    with pytest.raises(PrecompileError, match="torch cannot load it") as e, torch.no_grad():
        bad(*inputs)
    assert "\n" not in str(e.value)


@pytest.mark.e2e
def test_an_artifact_is_compressed_and_a_signed_bomb_is_refused_without_inflating_it(precompiled, tmp_path):
    model_file, directory = precompiled
    entry = json.loads((directory / MANIFEST).read_text())["manifest"]["artifacts"][0]
    assert entry["bytes"] <= 2 * entry["recipe_bytes"], entry  # torch's pickle and our part, compressed
    copy = _copy(directory, tmp_path)
    info = _info(copy)
    bomb = zlib.compress(bytes(16 << 20))  # 16 MiB of zeros in ~16 KiB, declared as 1000 bytes
    (copy / "range-000.hpuaot").write_bytes(framed(msgpack.packb({"info": info, "size": 1000, "torch": bomb}),
                                                   KEY.encode()))
    with pytest.raises(PrecompileError, match="does not inflate to the 1000 bytes it declares"):
        read_artifact(copy / "range-000.hpuaot")
    older = framed(msgpack.packb({"info": info, "torch": b"uncompressed"}), KEY.encode())
    (copy / "range-000.hpuaot").write_bytes(older[:7] + b"\x01" + older[8:])  # format 1: stored uncompressed
    with pytest.raises(PrecompileError, match="artifact format 1, this reads 2: precompile again"):
        read_artifact(copy / "range-000.hpuaot")
    with pytest.raises(PrecompileError, match="more than the 100 an artifact may hold"):
        inflate(zlib.compress(bytes(200)), 200, "crafted", cap=100)
    assert inflate(zlib.compress(b"torch"), 5, "genuine") == b"torch"


def _resign(directory: Path, change) -> None:
    doc = json.loads((directory / MANIFEST).read_text())["manifest"]
    change(doc)
    (directory / MANIFEST).write_bytes(manifest_bytes(doc, KEY.encode()))


@pytest.mark.e2e
def test_a_version_target_or_parameter_mismatch_is_refused_naming_it(precompiled, tmp_path):
    model_file, directory = precompiled
    model = hpu_backend.load_model_file(str(model_file)).make_model()
    with pytest.raises(PrecompileError, match="target=gaudi2, this process has target=gaudi3"):
        hpu_backend.load_precompiled(directory, model, options={"target": "gaudi3"})
    with pytest.raises(PrecompileError, match=r"the model.s 0.bias is \[32\] float32, the artifacts were built "
                                              r"with \[16\] float32"):
        hpu_backend.load_precompiled(directory, torch.nn.Sequential(torch.nn.Linear(8, 32)))
    copy = _copy(directory, tmp_path)
    _resign(copy, lambda doc: doc["fingerprint"].update(torch="2.0.0"))
    with pytest.raises(PrecompileError,
                       match=re.escape("built for torch=2.0.0, this process has torch=" + torch.__version__)):
        hpu_backend.load_precompiled(copy, model)
    # Captured where Dynamo saw an accelerator, its bytecode reads that device's current stream.
    _resign(copy, lambda doc: doc["fingerprint"].update(torch=torch.__version__, accelerator="cuda"))
    with pytest.raises(PrecompileError, match=re.escape(
            f"built for accelerator=cuda, this process has accelerator={accelerator()}")):
        hpu_backend.load_precompiled(copy, model)


@pytest.mark.e2e
def test_bad_directories_are_one_line_at_the_cli(precompiled, tmp_path):
    _, directory = precompiled
    copy = _copy(directory, tmp_path)
    assert "1 artifact" in one_line(cli("verify", copy))
    (copy / "range-000.hpuaot").write_bytes(b"\x80\x04" + pickle.dumps({"saved by": "torch, another backend"}))
    assert "not a precompiled hpu_backend artifact" in one_line(cli("verify", copy, code=1))
    (copy / "range-000.hpuaot").unlink()
    assert "listed in the manifest but missing" in one_line(cli("show", copy, code=1))
    (copy / MANIFEST).write_text("{not json")
    assert "not a manifest" in one_line(cli("ls", copy, code=1))
    graph_break = tiny_model(tmp_path, "breaks", TINY.replace(
        "def make_model():", "class Breaks(torch.nn.Module):\n    def forward(self, x):\n"
        "        print('side effect')\n        return x\n\ndef make_model():\n    return Breaks()\n\ndef unused():"))
    line = one_line(cli("precompile", graph_break, "-o", tmp_path / "out", code=1))
    assert "graph break" in line and "hpurecipe warm" in line, line


def test_training_and_dynamic_shapes_round_trip_through_torchs_own_save_and_load(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    def step(m, x):
        return m(x).square().mean()

    compiled = torch.compile(step, fullgraph=True, backend="hpu_backend", dynamic=True)
    fn = compiled.aot_compile(((model, torch.randn(3, 8)), {}))
    fn(model, torch.randn(3, 8)).backward()  # takes up the forward and backward recipes the artifact carries
    ours = msgpack.unpackb(PrecompiledGraph.serialize_compile_artifacts(fn._artifacts.compiled_fn))
    assert ours["format"] == "hpu_backend.precompiled" and len(ours["recipes"]) == 2  # data, not a pickle of ours
    fn.save_compiled_function(str(tmp_path / "step.bin"))
    with open(tmp_path / "step.bin", "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    for batch in (3, 11):
        x = torch.randn(batch, 8)
        model.zero_grad()
        step(model, x).backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        loss = loaded(model, x)
        loss.backward()
        torch.testing.assert_close(loss, step(model, x))
        torch.testing.assert_close([p.grad for p in model.parameters()], want)
    assert isinstance(loaded._artifacts.compiled_fn, PrecompiledGraph)
    assert loaded._artifacts.compiled_fn.program.mode == "training"


@pytest.mark.e2e
def test_warm_precompile_is_the_precompile_command(precompiled, tmp_path):
    model_file, _ = precompiled
    out = tmp_path / "warmed.precompiled"
    assert "(1 artifact)" in cli("warm", model_file, "--axis", "batch=4", "--precompile", out).output
    manifest = json.loads((out / MANIFEST).read_text())["manifest"]
    assert [a["ranges"] for a in manifest["artifacts"]] == [{"batch": [4, 4]}], manifest["artifacts"]
    line = one_line(cli("warm", model_file, "--train", "--precompile", out, code=2))
    assert "takes no --train" in line, line


@pytest.mark.e2e
def test_a_precompiled_directory_travels_in_a_signed_bundle(precompiled, tmp_path):
    _, directory = precompiled
    bundle = tmp_path / "ship.tar"
    cli("export", bundle, "-d", tmp_path / "no-cache", "--precompiled", directory)
    target = tmp_path / "arrived"
    cli("import", bundle, "-d", tmp_path / "cache", "--precompiled", target)
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in directory.iterdir())
    assert "1 artifact" in one_line(cli("verify", target))
    (target / "stray.txt").write_text("not ours")  # import never writes over a directory of other files
    assert "is not a precompiled directory" in one_line(cli("import", bundle, "--precompiled", target, code=1))


@pytest.mark.e2e
def test_coverage_says_which_points_lie_outside_every_precompiled_range(precompiled):
    model_file, directory = precompiled
    cli("coverage", model_file, "--precompiled", directory)  # the points it was built over: exit 0
    result = cli("coverage", model_file, "--precompiled", directory, "--axis", "batch=1,2,8", "--json", code=1)
    rows = json.loads(result.stdout)["points"]
    assert [r["artifact"] != "" for r in rows] == [False, True, True], rows


# -- what Dynamo guarded about the module: hooks and structure ------------------------------------------------------

def triple(module, args, output):
    return output * 3


def shift(module, args):
    return (args[0] + 1,)


def _served_counting(directory: Path, model: torch.nn.Module):
    """The served model, and a list that grows by one whenever its artifact (not the fallback) runs a call."""
    served = hpu_backend.load_precompiled(directory, model)
    runs: list[int] = []
    fn = served.functions[0].fn  # torch's function, unpickled on first use
    artifact_fn = fn.fn
    fn.fn = lambda *args: runs.append(1) or artifact_fn(*args)
    return served, runs


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hpu_backend.shipping.precompiled")]


@pytest.mark.e2e
@pytest.mark.parametrize("where, register, expected", [
    ("submodule", lambda m: m[0].register_forward_hook(triple), "the model's '0' has hooks: forward hook "
                                                                "test_precompile.triple (precompiled with none)"),
    ("model", lambda m: m.register_forward_pre_hook(shift), "the model has hooks: forward pre hook "
                                                            "test_precompile.shift (precompiled with none)"),
    ("every module", lambda m: torch.nn.modules.module.register_module_forward_hook(triple),
     "every module has hooks: forward hook test_precompile.triple"),
])
def test_a_hook_added_after_loading_is_run_with_one_warning_and_removing_it_serves_the_artifact_again(
        precompiled, caplog, where, register, expected):
    model_file, directory = precompiled
    spec = hpu_backend.load_model_file(str(model_file))
    model = spec.make_model().eval()
    served, runs = _served_counting(directory, model)
    x, _ = spec.inputs({"batch": 8}, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x))
        assert runs == [1]
        handle = register(model)
        try:
            with caplog.at_level(logging.WARNING, logger="hpu_backend"):
                for _ in range(2):
                    torch.testing.assert_close(served(x), model(x))  # the hook's effect, as eager has it
        finally:
            handle.remove()
        assert runs == [1]  # the artifact, which has no hook, ran neither call
        assert len(_warnings(caplog)) == 1 and expected in _warnings(caplog)[0], _warnings(caplog)
        torch.testing.assert_close(served(x), model(x))
    assert runs == [1, 1]  # the hook removed: the model is the precompiled one again


@pytest.mark.e2e
def test_a_model_whose_modules_differ_is_refused_at_load_and_a_submodule_swapped_later_is_run(precompiled, caplog):
    model_file, directory = precompiled
    spec = hpu_backend.load_model_file(str(model_file))
    model = spec.make_model().eval()
    model[1] = torch.nn.GELU()  # no parameters: the parameter check cannot see it
    with pytest.raises(PrecompileError, match=r"the model's '1' is a torch.nn.modules.activation.GELU \(precompiled "
                                              r"with torch.nn.modules.activation.ReLU\); precompile it again"):
        hpu_backend.load_precompiled(directory, model)
    model[1] = torch.nn.ReLU()
    served, runs = _served_counting(directory, model)
    x, _ = spec.inputs({"batch": 8}, seed=6)
    model[1] = torch.nn.Tanh()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend"):
        torch.testing.assert_close(served(x), model(x))
    assert runs == [] and "the model's '1' is a torch.nn.modules.activation.Tanh" in _warnings(caplog)[0]


# -- the sizes an artifact serves: listed as served (issue 47, item 7) ----------------------------------------------

@pytest.mark.e2e
def test_the_listing_names_the_sizes_served_from_recipes_and_a_call_outside_them_warns_naming_it(precompiled,
                                                                                                 caplog):
    """Batch 2 and 8 under exp:2 buckets: recipes for 0..2 (Dynamo specializes 0 and 1) and 5..8. Listed as
    "batch=2,5..8", not "batch=2..8": batch 6 is served by the artifact, batch 4 (which would compile a bucket)
    and 1 fall back with one warning naming the size."""
    from hpu_backend.metrics import metric_global

    model_file, directory = precompiled
    assert "batch=2,5..8" in cli("ls", directory).output
    assert json.loads(cli("ls", directory, "--json").stdout)[0]["serves"] == {"batch": [[2, 2], [5, 8]]}
    spec = hpu_backend.load_model_file(str(model_file))
    model = spec.make_model().eval()
    served, runs = _served_counting(directory, model)
    lowered = dict(metric_global("graph_compilation").stats())["TotalNumber"]
    x6, _ = spec.inputs({"batch": 6}, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(served(x6), model(x6))
    assert runs == [1] and dict(metric_global("graph_compilation").stats())["TotalNumber"] == lowered
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for batch in (4, 1):
            x, _ = spec.inputs({"batch": batch}, seed=1)
            torch.testing.assert_close(served(x), model(x))
    assert runs == [1]
    (warning,) = _warnings(caplog)
    assert "no artifact accepts this call (range-000.hpuaot: batch=4 is outside batch=2,5..8)" in warning, warning
    rows = json.loads(cli("coverage", model_file, "--precompiled", directory, "--axis", "batch=2,4,6,8", "--json",
                          code=1).stdout)["points"]
    assert [r["artifact"] != "" for r in rows] == [True, False, True, True], rows


@pytest.mark.e2e
@pytest.mark.parametrize("change, name", [
    (lambda doc: doc["artifacts"][0].update(serves={"batch": "all"}), "range-000.hpuaot serves"),
    (lambda doc: doc.update(dims={"batch": [[0, -1]]}), "dims"),
    (lambda doc: doc.update(modules={"classes": {"": 3}, "hooks": {}}), "modules"),
])
def test_a_malformed_record_of_sizes_or_modules_is_one_line(precompiled, tmp_path, change, name):
    model_file, directory = precompiled
    copy = _copy(directory, tmp_path)
    _resign(copy, change)
    with pytest.raises(PrecompileError, match=f"its {name} is malformed"):
        hpu_backend.load_precompiled(copy, hpu_backend.load_model_file(str(model_file)).make_model())
    assert f"its {name} is malformed" in one_line(cli("ls", copy, code=1))


@pytest.mark.e2e
def test_gpt_as_the_user_served_it_batch_3_and_seq_8_from_recipes_and_seq_200_with_a_warning(tmp_path, caplog,
                                                                                             monkeypatch):
    """Issue 47: the README's gpt artifacts, listed as "batch=2 seq=16..128", served (3, 64), (2, 200) and (1, 8)
    with no warning. The listing now says what the recipes hold, and the calls agree with it: (3, 64) and (1, 8)
    run from the artifacts with nothing lowered, (2, 200) warns naming seq=200 and is compiled."""
    from hpu_backend.metrics import metric_global

    monkeypatch.delenv("HPURECIPE_BUNDLE_KEY", raising=False)  # signed with this machine's own key, made now
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'cli'}")
    proc = subprocess.run([sys.executable, "-m", "hpurecipe.main", "precompile", "models/gpt.py", "--axis",
                           "seq=16,64", "-o", str(tmp_path / "gpt")], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "batch=1 seq=2..16,33..64" in proc.stdout and "batch=2..16 seq=2..16,33..64" in proc.stdout, proc.stdout
    assert "signed with this machine's own key: it loads here only" in proc.stdout, proc.stdout
    key = tmp_path / "config" / "hpu_backend" / "machine.key"
    assert key.stat().st_mode & 0o777 == 0o600
    spec = hpu_backend.load_model_file(str(ROOT / "models/gpt.py"))
    model = spec.make_model().eval()
    served = hpu_backend.load_precompiled(tmp_path / "gpt", model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hpu_backend"):
        for batch, seq, lowers in ((3, 64, 0), (1, 8, 0), (2, 200, 1)):
            ids = spec.split(spec.make_inputs(batch=batch, seq=seq))
            before = dict(metric_global("graph_compilation").stats())["TotalNumber"]
            torch.testing.assert_close(served(*ids), model(*ids))
            assert dict(metric_global("graph_compilation").stats())["TotalNumber"] - before == lowers, (batch, seq)
    (warning,) = _warnings(caplog)
    assert "range-001.hpuaot: seq=200 is outside batch=2..16 seq=2..16,33..64" in warning, warning
    # Another machine (another user's key), or this one with a team key set: refused before torch reads a byte.
    mine = key.read_bytes()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-machine"))
    with pytest.raises(PrecompileError, match="no key here .*precompile it here, or set the same team key"):
        hpu_backend.load_precompiled(tmp_path / "gpt", model)
    own_signer(create=True)  # that machine has a key of its own: not the one that signed
    with pytest.raises(PrecompileError, match=re.escape(f"signed with a machine's own key (id {key_id(mine)}), not "
                                                        "with this machine's own key (id ")):
        hpu_backend.load_precompiled(tmp_path / "gpt", model)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", KEY)
    with pytest.raises(PrecompileError, match="signed with this machine's own key .*HPURECIPE_BUNDLE_KEY is set: "
                                              "unset it to load this"):
        hpu_backend.load_precompiled(tmp_path / "gpt", model)


@pytest.mark.e2e
def test_ls_and_show_list_an_unsigned_directory_without_unpickling_it(precompiled, tmp_path, monkeypatch):
    """An unsigned directory (written by hand, or by a version that did not sign) lists, since listing reads only
    its plain data; verifying and loading it refuse, whatever the environment says."""
    model_file, directory = precompiled
    copy = _copy(directory, tmp_path)
    marker = tmp_path / "pickle-ran"
    doc = json.loads((copy / MANIFEST).read_text())["manifest"]
    for entry in doc["artifacts"]:
        data = artifact_bytes(_info(directory), _evil_pickle(marker), None)  # unsigned, and its pickle is live
        (copy / entry["file"]).write_bytes(data)
        entry["sha256"] = read_artifact(copy / entry["file"], listing=True).digest
    (copy / MANIFEST).write_bytes(manifest_bytes(doc, None))
    listed = cli("ls", copy).output
    assert all(entry["file"] in listed for entry in doc["artifacts"])
    assert "batch=2,5..8" in listed.replace(" ", "")  # the sizes it serves
    assert "unsigned: never loaded" in cli("show", copy).output
    assert "not signed" in one_line(cli("verify", copy, code=1))
    model = hpu_backend.load_model_file(str(model_file)).make_model()
    monkeypatch.setenv("HPURECIPE_TRUST_UNSIGNED", "1")  # an opt-in of older versions: it changes nothing
    with pytest.raises(PrecompileError, match="not signed"):
        hpu_backend.load_precompiled(copy, model)
    (copy / MANIFEST).write_bytes(manifest_bytes(doc, KEY.encode()))  # the manifest signed, its artifacts not
    with pytest.raises(PrecompileError, match="range-000.hpuaot: not signed"):
        hpu_backend.load_precompiled(copy, model)
    assert not marker.exists()


@pytest.mark.e2e
def test_a_directory_signed_with_a_key_not_here_lists_but_does_not_load(precompiled, tmp_path, monkeypatch):
    model_file, directory = precompiled
    model = hpu_backend.load_model_file(str(model_file)).make_model()
    shown = cli("show", directory).output
    assert f"checked with HPURECIPE_BUNDLE_KEY (id {key_id(KEY.encode())})" in " ".join(shown.split())
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", "another team key")
    with pytest.raises(PrecompileError, match=re.escape(
            f"manifest.json: the signature does not match: signed with a team key HPURECIPE_BUNDLE_KEY (id "
            f"{key_id(KEY.encode())}), not with HPURECIPE_BUNDLE_KEY (id {key_id(b'another team key')}")) as e:
        hpu_backend.load_precompiled(directory, model)
    assert "\n" not in str(e.value)
    monkeypatch.delenv("HPURECIPE_BUNDLE_KEY")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # a machine with no key of its own yet
    with pytest.raises(PrecompileError, match="signed with a team key .*, and there is no key here to check it"):
        hpu_backend.load_precompiled(directory, model)
    assert not (tmp_path / "config").exists()  # loading never makes a key
    shown = " ".join(cli("show", directory).output.split())
    assert f"signed with a team key HPURECIPE_BUNDLE_KEY (id {key_id(KEY.encode())}); not checked" in shown
    assert "no key here to check it" in one_line(cli("verify", directory, code=1))
    own_signer(create=True)
    key_path().chmod(0o644)  # a key file others may read is refused, whatever it signed
    assert "readable or writable by others; chmod 600 it" in one_line(cli("verify", directory, code=1))
