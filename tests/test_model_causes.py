"""What real models need beyond the toy models: indexing with None, fast paths that fall back instead of
crashing, library custom ops (a second process loads their recipe), weight-norm training, and float
maths on symbolic sizes under dynamic shapes in strict mode. Each compared with eager."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from hpu_backend.runtime import build_callable, executor, ops
from hpu_backend.serve.compiled import collect_recipes
from conftest import ROOT

STRICT = {"strict": True, "cache": False}


def _index_with_none(x, idx):
    y = x.clone()
    y[:, idx] = 0  # index_put with None in the index list
    z = torch.ops.aten.index_put(x, [None, idx], torch.tensor(1.0))
    return x[:, idx] * 2, y, z  # index with None


def test_indexing_with_none_in_the_index_list_matches_eager_with_gradients():
    x = torch.randn(4, 5, requires_grad=True)
    idx = torch.tensor([0, 2])
    compiled = torch.compile(_index_with_none, backend="hpu_backend", options=STRICT)
    out, ref = compiled(x, idx), _index_with_none(x, idx)
    torch.testing.assert_close(out, ref)
    grad, = torch.autograd.grad(sum(o.sum() for o in out), x)
    ref_grad, = torch.autograd.grad(sum(o.sum() for o in ref), x)
    torch.testing.assert_close(grad, ref_grad)


def test_a_failing_fast_path_falls_back_to_the_standard_call_with_one_warning(monkeypatch, caplog):
    with collect_recipes() as found, torch.no_grad():
        torch.compile(lambda a, b: torch.mul(a, b) + 1, backend="hpu_backend", options=STRICT)(
            torch.ones(3), torch.ones(3))
    recipe = found[0][1]
    mul = next(n.op for n in recipe.nodes if n.op.startswith("aten::mul"))

    def broken(*args, **kwargs):  # a binding that refuses its arguments, as index's did with None
        raise TypeError("expected Tensor as element 0 in argument 1, but got NoneType")

    fast = ops.fast_callable
    monkeypatch.setattr(ops, "fast_callable", lambda name: broken if name == mul else fast(name))
    monkeypatch.setattr(executor, "_fast_path_warned", set())
    run = build_callable(recipe)
    a, b = torch.randn(3), torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="hpu_backend.runtime.executor"):
        outs = [run([a, b])[0] for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, a * b + 1)
    warned = [r for r in caplog.records if "fast path" in r.getMessage()]
    assert len(warned) == 1 and mul in warned[0].getMessage()


def test_a_genuine_op_error_still_raises_from_the_standard_call():
    with collect_recipes() as found, torch.no_grad():
        torch.compile(lambda x, i: x[i] + 1, backend="hpu_backend", options=STRICT)(
            torch.ones(3), torch.tensor([0]))
    run = build_callable(found[0][1])
    with pytest.raises(IndexError, match="out of bounds"):
        run([torch.ones(3), torch.tensor([7])])


CUSTOM_OP = '''
import sys, torch
from hpu_backend.serve.compiled import collect_recipes

@torch.library.custom_op("hpu_test_lib::scaled_relu", mutates_args=())
def scaled_relu(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0) * 1.5

@scaled_relu.register_fake
def _(x):
    return torch.empty_like(x)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh())
x = torch.randn(4, 6)
def f(x):
    return torch.ops.hpu_test_lib.scaled_relu(model(x)) @ model[0].weight
options = {"strict": True, "cache_config": sys.argv[1] + ",false,64"}
with collect_recipes() as found, torch.no_grad():
    out = torch.compile(f, backend="hpu_backend", options=options)(x)
torch.testing.assert_close(out, f(x))
(recipe, hit), = [(r, h) for _, r, h in found]
fb, = recipe.facts["placement"]["fallbacks"]
print("HIT" if hit else "MISS", fb["op"], recipe.facts["cost"]["transfer_s"] > 0, recipe.facts["cost"]["cpu_s"] > 0)
'''

UNREGISTERED = '''
import sys
from recipecache import CacheConfig, RecipeCache
from hpu_backend.runtime import build_callable
from hpu_backend.serve.store import RecipeStore
from hpu_backend.formats.recipe import Recipe, RecipeFormatError
cache = RecipeCache(CacheConfig.parse(sys.argv[1] + ",false,64"))
def is_recipe(key):
    try:
        return Recipe.from_bytes(cache.get(key)) is not None
    except RecipeFormatError:
        return False  # the stored program of the Dynamo graph
key, = [k for k in cache.keys() if is_recipe(k)]
loaded = RecipeStore(cache).load(key, build_callable)
cache.flush()  # the quarantine runs in the background
print("LOADED" if loaded else "MISS", cache.contains(key),
      "hpu_test_lib" in sys.modules)
'''


def _python(code: str, *args: str, path: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.e2e
def test_a_library_custom_op_is_a_cpu_fallback_node_that_a_second_process_loads_from_the_cache(tmp_path):
    cache = str(tmp_path / "cache")
    # Strict mode accepts it (a library op has no device kernel); it is named with its own namespace and
    # costed as a CPU fallback with host transfers; a second process runs the stored recipe.
    assert _python(CUSTOM_OP, cache) == "MISS hpu_test_lib::scaled_relu True True"
    assert _python(CUSTOM_OP, cache) == "HIT hpu_test_lib::scaled_relu True True"
    # A process that has not registered the op: the stored recipe is a miss (quarantined), and a module
    # named like the op's namespace, on the path, is never imported to resolve it.
    (tmp_path / "hpu_test_lib.py").write_text("raise SystemExit('imported by name')\n")
    assert _python(UNREGISTERED, cache, path=str(tmp_path)) == "MISS False False"


class WeightNormed(torch.nn.Module):
    """wav2vec2's positional convolution (weight norm over dim 2) and a classic weight-normed linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 6, 3, padding=1), dim=2)
        self.lin = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 5))

    def forward(self, x):
        return self.lin(torch.nn.functional.gelu(self.conv(x)).transpose(1, 2)).pow(2).mean()


def test_weight_norm_training_runs_on_the_device_in_strict_mode():
    model, twin = WeightNormed(), WeightNormed()
    x = torch.randn(2, 4, 7)
    loss = torch.compile(model, backend="hpu_backend", options=STRICT)(x)  # strict: no CPU fallback anywhere
    loss.backward()
    ref = twin(x)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"{name}: {m}")


def _pools_pads_and_sampling(x, grid, v):
    F = torch.nn.functional
    a = F.adaptive_max_pool2d(x, 3) + F.avg_pool3d(x.unsqueeze(1), 2).squeeze(1).sum()
    b = F.pad(x, (1, 1, 1, 1), mode="replicate").mean() + F.pad(x[0], (2, 2), mode="reflect").mean()
    c = F.grid_sample(x, grid, align_corners=False)
    d = torch.addmv(v[:4], x[0, 0, :4], v) + torch.cdist(x[0], x[1]).sum()
    return a.sum() + b + c.pow(2).sum() + d.sum()


@pytest.mark.e2e
def test_backward_kernels_real_models_need_run_on_the_device_in_strict_mode():
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    grid = torch.rand(2, 3, 3, 2, requires_grad=True) * 2 - 1
    v = torch.randn(6, requires_grad=True)
    loss = torch.compile(_pools_pads_and_sampling, backend="hpu_backend", options=STRICT)(x, grid, v)
    grads = torch.autograd.grad(loss, [x, grid, v])
    ref = _pools_pads_and_sampling(x, grid, v)
    torch.testing.assert_close(loss, ref)
    for g, r in zip(grads, torch.autograd.grad(ref, [x, grid, v])):
        torch.testing.assert_close(g, r)


class ScaledNorm(torch.nn.Module):
    """An RMS norm with a float ``eps`` attribute and a scale computed from a symbolic size: under
    ``dynamic=True`` both become float64 0-dim tensor maths in the aten graph."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-5
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        scale = torch.full([], (2.0 / x.shape[1]) ** 0.5, dtype=h.dtype)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) / scale


def test_float_maths_on_sizes_is_host_scalar_work_not_a_float64_device_op():
    model = ScaledNorm()
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True, options=STRICT)
    with collect_recipes() as found, torch.no_grad():
        for n in (3, 5):  # two sizes, one recipe bucket each, no recompilation of the graph
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(compiled(x), model(x))
    recipe = found[0][1]
    assert recipe.symbols and not recipe.facts["placement"]["fallbacks"]
    host = [n for n in recipe.nodes if n.engine == "host" and n.out[0].kind == "tensor"]
    assert any(n.out[0].dtype == "float64" for n in host)  # the float64 scalar maths runs on the host
    assert not [n.name for n in recipe.nodes if n.engine not in ("host", "view")
                and any(s.kind == "tensor" and s.dtype == "float64" for s in n.out)]
