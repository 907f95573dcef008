"""The recipe is the program: a warm cache serves a fresh process without AOTAutograd or lowering.

Each model in models/ is compiled in one process (inference and a training step), then in a fresh
process against the same cache, where AOTAutograd's tracer must not run and nothing may be lowered:
the outputs and gradients there can only come from the stored programs and recipes, and must
match eager. Stored entries that are damaged (checksum intact, content not) are quarantined and
recompiled, never run and never a crash.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys

import msgpack
import pytest
import torch

from conftest import ROOT
from hpu_backend.metrics import metric_global
from hpu_backend.formats.program import Contract, Program, parse_payload
from hpu_backend.formats.recipe import RecipeFormatError
from hpu_backend.runtime import RecipeLoadError, build_callable
from hpu_backend.serve.session import Session
from hpu_backend.settings import Settings
from recipecache import CacheConfig, RecipeCache, decode_entry, encode_entry

MODELS = ("mnist", "gpt", "bert", "resnet")

CHILD = r"""
import copy, json, sys
import torch
import torch._functorch.aot_autograd as aot
import hpu_backend
from hpu_backend.metrics import metric_global

traces = [0]
_capture = aot.aot_stage1_graph_capture
def counting(*args, **kwargs):
    traces[0] += 1
    return _capture(*args, **kwargs)
aot.aot_stage1_graph_capture = counting

def tensors(value):
    if isinstance(value, torch.Tensor):
        return [value.detach()]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []

def check(spec, train, point):
    inputs = spec.make_inputs(**point, seed=1)
    eager = spec.make_model().train(train)
    model = copy.deepcopy(eager)
    kwargs = {} if spec.dynamic is None else {"dynamic": spec.dynamic}
    compiled = torch.compile(model, backend="hpu_backend", options=dict(spec.options), **kwargs)
    for m, fn in ((eager, eager), (model, compiled)):
        torch.manual_seed(0)
        with torch.set_grad_enabled(train):
            out = fn(*spec.split(inputs))
            if train:
                spec.loss(out, *inputs).backward()
        m.result = tensors(out) + [p.grad for p in m.parameters()] + list(m.buffers())
    torch.testing.assert_close(model.result, eager.result)

for name in sys.argv[1].split(","):
    spec = hpu_backend.load_model_file(f"models/{name}.py")
    points = spec.points()
    for train in (False, True):
        for point in (points[0], points[-1]):
            check(spec, train, point)
cache = dict(metric_global("recipe_cache").stats())
print(json.dumps({"aot_traces": traces[0], "lowered": dict(metric_global("graph_compilation").stats())["TotalNumber"],
                  "program_hits": cache["ProgramHit"], "program_misses": cache["ProgramMiss"],
                  "recipe_misses": cache["TotalMiss"], "pipeline": "hpu_backend.lowering.pipeline" in sys.modules}))
"""


def _run(models: str, cache_dir) -> dict:
    env = dict(os.environ, PT_HPU_RECIPE_CACHE_CONFIG=f"{cache_dir},false,1024")
    proc = subprocess.run([sys.executable, "-c", CHILD, models], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_a_warm_cache_serves_every_model_without_tracing_or_lowering(tmp_path):
    models = ",".join(MODELS)
    cold = _run(models, tmp_path / "cache")
    assert cold["aot_traces"] > 0 and cold["lowered"] > 0 and cold["program_misses"] > 0
    warm = _run(models, tmp_path / "cache")
    assert warm["aot_traces"] == 0, warm  # AOTAutograd never traced: programs served every graph
    assert warm["lowered"] == 0 and warm["recipe_misses"] == 0, warm  # every recipe came from disk
    assert warm["program_hits"] >= len(MODELS) * 2 and warm["program_misses"] == 0, warm
    assert cold["pipeline"] and not warm["pipeline"], warm  # a hit never imports the lowering pipeline


# -- damaged entries -------------------------------------------------------------------------------------

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.offset


def _compile_and_run(cache_dir, x):
    """A new Dynamo and a session of its own over the cache (as in a fresh process); flushed to disk on return."""
    torch._dynamo.reset()
    options = {"cache_config": f"{cache_dir},false,64"}
    session = Session.open(Settings.from_options(options))
    torch.manual_seed(0)
    model = Tiny()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True, options=options)
    with session.use(), torch.no_grad():
        out = compiled(x), model(x)
    session.flush()
    return out


def _usable(payload: bytes) -> bool:
    try:
        parsed = parse_payload(payload)
        for recipe in [g.template for g in parsed.graphs] if isinstance(parsed, Program) else [parsed]:
            build_callable(recipe)
    except (RecipeFormatError, RecipeLoadError):
        return False
    return True


def _payloads(cache_dir) -> dict[str, bytes]:
    cache = RecipeCache(CacheConfig.parse(f"{cache_dir},false,64"))
    return {i.key: cache.peek(i.key).payload for i in cache.entries()}


def _keys(cache_dir, programs: bool) -> list[str]:
    return [k for k, v in _payloads(cache_dir).items() if isinstance(parse_payload(v), Program) == programs]


def _quarantined(cache_dir) -> int:
    return len(list((cache_dir / "quarantine").iterdir()))


def _rewrite(cache_dir, key: str, mutate) -> None:
    """Replace an entry's payload with a mutated one under a valid header and checksum."""
    cache = RecipeCache(CacheConfig.parse(f"{cache_dir},false,64"))
    path = cache._disk.entry_path(key)
    entry = decode_entry(path.read_bytes())
    raw = msgpack.unpackb(entry.payload, raw=False)
    mutate(raw)
    path.chmod(0o600)
    path.write_bytes(encode_entry(key, msgpack.packb(raw, use_bin_type=True), entry.meta, entry.created))


def _first_node(raw, op_prefix="aten::"):
    return next(n for n in raw["nodes"] if n["op"].startswith(op_prefix))


def _set_op(op):
    def mutate(raw):
        _first_node(raw)["op"] = op
    return mutate


def _forge_constant(raw):
    raw["constants"] = {"big": {"dtype": "float32", "shape": [1 << 20, 1 << 20], "data": b""}}


def _bad_reference(raw):
    _first_node(raw)["args"][0] = {"r": [1, 2]}  # a list where a value name belongs


def _bad_kwarg(raw):
    next(n for n in raw["nodes"] if "relu" in n["op"])["kwargs"]["alpha\n"] = 1


def _bad_args(raw):
    _first_node(raw)["args"] = [{"r": raw["input_names"][0]}] * 7  # an op called with arguments it does not take


def _bucket_on_unknown_symbol(raw):
    raw["bucket"]["s99"] = [1, 4]


def _bad_symbol_source(raw):
    raw["symbol_sources"] = [[99, 0]] * len(raw["symbol_sources"])


def _fact(path, value):
    """Set a fact (a checksum-valid entry whose facts have the wrong shape)."""
    def mutate(raw):
        *parents, last = path.split(".")
        target = raw["facts"]
        for p in parents:
            target = target[p]
        target[last] = value
    return mutate


@pytest.mark.parametrize("mutate", [_set_op("aten::save.default"), _set_op("aten::_print.default"),
                                    _set_op("aten::manual_seed.default"), _forge_constant, _bad_reference,
                                    _bad_kwarg, _bad_symbol_source, _bad_args, _bucket_on_unknown_symbol,
                                    _fact("placement", ["gpu"]),
                                    _fact("placement.fallbacks", [{"op": ["aten::add"]}]),
                                    _fact("fusions", [3]), _fact("memory", {"peak_bytes": "1 GB"})],
                         ids=["save", "print", "manual_seed", "constant", "reference", "kwarg", "symbol_source",
                              "args", "bucket", "placement", "fallback", "fusions", "memory"])
def test_a_damaged_recipe_is_quarantined_and_recompiled(tmp_path, mutate):
    cache_dir, x = tmp_path / "c", torch.randn(5, 8)
    _compile_and_run(cache_dir, x)
    (key,) = _keys(cache_dir, programs=False)
    _rewrite(cache_dir, key, mutate)
    assert not _usable(_payloads(cache_dir)[key]) or mutate is _bad_args  # the damage is real (args: when run)
    before = dict(metric_global("graph_compilation").stats())["TotalNumber"]
    got, want = _compile_and_run(cache_dir, x)
    torch.testing.assert_close(got, want)
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == before + 1  # recompiled
    assert _quarantined(cache_dir) == 1
    assert _usable(_payloads(cache_dir)[key])  # and stored again, sound


def _contract_out_of_range(raw):
    raw["contract"]["mutated_inputs"] = [10_000]


def _program_op(raw):
    _first_node(raw["graphs"][0]["template"])["op"] = "aten::save.default"


def _guard(tree):
    def mutate(raw):
        raw["guards"].append(tree)
    return mutate


@pytest.mark.parametrize("mutate", [_contract_out_of_range, _program_op, _guard(["eq", ["floordiv", 1, 0], 1]),
                                    _guard(["eq", "s77", 1])],
                         ids=["contract", "op", "guard_divides_by_zero", "guard_unbound_symbol"])
def test_a_damaged_program_is_a_miss_and_quarantined(tmp_path, mutate):
    cache_dir, x = tmp_path / "c", torch.randn(5, 8)
    _compile_and_run(cache_dir, x)
    (key,) = _keys(cache_dir, programs=True)
    _rewrite(cache_dir, key, mutate)
    assert not _usable(_payloads(cache_dir)[key])
    hits = dict(metric_global("recipe_cache").stats())["ProgramHit"]
    got, want = _compile_and_run(cache_dir, x)
    torch.testing.assert_close(got, want)
    assert dict(metric_global("recipe_cache").stats())["ProgramHit"] == hits  # traced, not served
    assert _quarantined(cache_dir) == 1
    assert _usable(_payloads(cache_dir)[key])


def test_a_hit_in_this_process_runs_the_stored_program(tmp_path):
    """After torch._dynamo.reset(), the same process serves the graph from the disk cache."""
    cache_dir, x = tmp_path / "c", torch.randn(6, 8)
    first, want = _compile_and_run(cache_dir, x)
    hits = dict(metric_global("recipe_cache").stats())["ProgramHit"]
    again, _ = _compile_and_run(cache_dir, x)
    assert dict(metric_global("recipe_cache").stats())["ProgramHit"] == hits + 1
    torch.testing.assert_close(again, want)


class Normed(torch.nn.Module):
    """Floats AOTAutograd's float pass has Dynamo specialize (the trace restarts): a LayerNorm's ``eps`` (Dynamo
    guards its value) and an Embedding's ``norm_type`` (unused without ``max_norm``: no guard)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, tokens):
        return self.ln(torch.relu(self.emb(tokens)))


def _run_normed(cache_dir, x, eps: float, monkeypatch):
    """Like _compile_and_run, for Normed; also how many Dynamo graphs reached the backend (2: the trace restarted)."""
    import hpu_backend.backend as backend

    graphs = [0]

    def counting(*args):
        graphs[0] += 1
        return program_key(*args)

    program_key = backend.program_key
    monkeypatch.setattr(backend, "program_key", counting)
    torch._dynamo.reset()
    options = {"cache_config": f"{cache_dir},false,64"}
    session = Session.open(Settings.from_options(options))
    torch.manual_seed(0)
    model = Normed()
    model.ln.eps = eps
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True, options=options)
    with session.use(), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        first = graphs[0]
        model.emb.norm_type = 3.0  # a changed float Dynamo may not guard: the served program's call checks it
        torch.testing.assert_close(compiled(x), model(x))
    session.flush()
    monkeypatch.undo()
    return first


def test_a_restarted_trace_is_served_from_its_first_graph_while_the_floats_keep_their_values(tmp_path, monkeypatch,
                                                                                             caplog):
    cache_dir, x = tmp_path / "c", torch.randint(0, 16, (6, 5))
    assert _run_normed(cache_dir, x, 1e-5, monkeypatch) == 2  # the float pass restarted the trace
    programs = {k: parse_payload(v) for k, v in _payloads(cache_dir).items() if isinstance(parse_payload(v), Program)}
    (restart,) = [p for p in programs.values() if p.mode == "restart"]
    assert restart.target in programs and programs[restart.target].mode == "inference"
    assert sorted(v for _, v in restart.floats) == sorted([(1e-5).hex(), (2.0).hex()])
    with caplog.at_level(logging.WARNING, logger="hpu_backend"):
        assert _run_normed(cache_dir, x, 1e-5, monkeypatch) == 1  # served from the first graph: no second trace
    assert "float input L['self']._modules['emb'].norm_type changed since it was compiled; calls with other values " \
           "run eagerly" in caplog.text
    assert _run_normed(cache_dir, x, 1e-3, monkeypatch) == 2  # another value: traced again, as Dynamo would


@pytest.mark.parametrize("target,floats", [("0" * 32, []), ("", [[0, "0x1p+0"]]), ("not a key", [[0, "0x1p+0"]]),
                                           ("0" * 32, [[0, "one"]]), ("0" * 32, [[0, "0x1p+0"], [0, "0x1p+1"]]),
                                           ("0" * 32, [[-1, "0x1p+0"]]), ("0" * 32, [[0]])],
                         ids=["no_floats", "no_target", "bad_key", "not_a_float", "twice", "negative", "short"])
def test_a_restart_naming_its_program_malformed_is_refused(target, floats):
    good = Program("restart", [], Contract(num_inputs=0), specialize=["zf0"], target="0" * 32, floats=[[3, "0x1p+0"]])
    assert Program.from_bytes(good.to_bytes()) == good
    with pytest.raises(RecipeFormatError):
        Program.from_bytes(dataclasses.replace(good, target=target, floats=floats).to_bytes())


def test_verify_lists_and_import_refuses_an_entry_with_malformed_facts(tmp_path):
    from cli_helpers import cli, cli_json

    cache_dir, x = tmp_path / "c", torch.randn(5, 8)
    _compile_and_run(cache_dir, x)
    (key,) = _keys(cache_dir, programs=False)
    cli("export", tmp_path / "good.tar", "-d", cache_dir)
    _rewrite(cache_dir, key, _fact("placement", ["gpu"]))
    report = cli_json("verify", "-d", cache_dir, code=1)
    assert [p["entry"] for p in report["problems"]] == [key] and "facts.placement" in report["problems"][0]["reason"]
    cli("export", tmp_path / "bad.tar", "-d", cache_dir)
    result = cli("import", tmp_path / "bad.tar", "-d", tmp_path / "other", code=1)
    assert "facts.placement" in result.output and len(result.output.strip().splitlines()) == 1
    cli("import", tmp_path / "good.tar", "-d", tmp_path / "other")


# -- AOTAutograd internals: a fast path with a safety net -------------------------------------------------

@pytest.fixture
def fresh_drift_warning(monkeypatch):
    from hpu_backend.serve import programs

    monkeypatch.setattr(programs, "_drift_warned", [])
    return programs


class _Renamed:
    """AOTAutograd's metadata as a torch version that renamed one field would hand it over."""

    def __init__(self, meta, missing: str):
        self._meta, self._missing = meta, missing

    def __getattr__(self, name):
        if name == self._missing:
            raise AttributeError(f"'ViewAndMutationMeta' object has no attribute {name!r}")
        return getattr(self._meta, name)


def test_a_renamed_aot_metadata_field_stores_no_program_and_warns_once(tmp_path, monkeypatch, caplog,
                                                                        fresh_drift_warning):
    real = torch._guards.TracingContext.try_get

    def try_get():
        ctx = real()
        if ctx is not None and ctx.fw_metadata is not None and not isinstance(ctx.fw_metadata, _Renamed):
            ctx.fw_metadata = _Renamed(ctx.fw_metadata, "num_outputs_aliased")
        return ctx

    monkeypatch.setattr(torch._guards.TracingContext, "try_get", staticmethod(try_get))
    cache_dir = tmp_path / "c"
    for x in (torch.randn(5, 8), torch.randn(7, 8)):
        got, want = _compile_and_run(cache_dir, x)
        torch.testing.assert_close(got, want)
    assert _keys(cache_dir, programs=True) == []  # no program stored: every process traces
    assert _keys(cache_dir, programs=False)  # recipes are still cached
    warnings = [r for r in caplog.records if "stored programs are off" in r.getMessage()]
    assert len(warnings) == 1 and "num_outputs_aliased" in warnings[0].getMessage()


def test_a_torch_without_an_internal_the_contract_runs_on_traces_instead_of_serving(tmp_path, monkeypatch,
                                                                                   caplog, fresh_drift_warning):
    cache_dir, x = tmp_path / "c", torch.randn(6, 8)
    _, want = _compile_and_run(cache_dir, x)
    assert _keys(cache_dir, programs=True)  # stored
    monkeypatch.delattr(torch.autograd.graph, "increment_version")
    hits = dict(metric_global("recipe_cache").stats())["ProgramHit"]
    got, _ = _compile_and_run(cache_dir, x)
    torch.testing.assert_close(got, want)
    assert dict(metric_global("recipe_cache").stats())["ProgramHit"] == hits  # traced, not served
    assert [r.getMessage() for r in caplog.records if "stored programs are off" in r.getMessage()] == [
        f"hpu_backend: stored programs are off on torch {torch.__version__}: torch lacks "
        "torch.autograd.graph.increment_version; every graph is traced by AOTAutograd instead (correct, but "
        "slower to start)"]


def test_the_program_key_holds_aot_autograds_configuration_and_the_autocast_state():
    from torch._functorch import config as aot_config

    from hpu_backend.serve.keys import program_key
    from hpu_backend.settings import Settings

    keys = []

    def backend(gm, example_inputs):
        keys.append(program_key(gm, example_inputs, Settings.from_options({}, env={})).parts["state"])
        return gm.forward

    def compile_once():
        torch._dynamo.reset()
        torch.compile(lambda x: (x @ x).relu(), backend=backend)(torch.randn(4, 4))

    compile_once()
    with aot_config.patch(view_replay_for_aliased_outputs=not aot_config.view_replay_for_aliased_outputs):
        compile_once()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compile_once()
    with torch.autocast("cpu", dtype=torch.float16):
        compile_once()
    compile_once()
    assert len(set(keys[:4])) == 4 and keys[4] == keys[0]
