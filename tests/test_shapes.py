"""Symbolic shapes: bucketed recipes, compile counts and reasons, guards, stable explainable keys."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hpu_backend.buckets import BucketError, parse_policy, policies_for, upper_points
from hpu_backend.serve.compiled import GuardViolation, collect_recipes
from hpu_backend.formats.keyparts import differing as explain
from hpu_backend.metrics import metric_localcontext
from conftest import load_model_file, run_python


@pytest.mark.parametrize("spec, value, bucket", [
    ("exact", 37, (37, 37)), ("exp", 37, (33, 64)), ("exp", 2, (2, 2)), ("exp", 64, (33, 64)),
    ("exp:16", 3, (0, 16)), ("exp:16", 17, (17, 32)), ("exp:16:64", 100, (100, 100)),
    ("lin:32", 33, (33, 64)), ("lin:32", 5, (1, 32)), ("list:8,16,128", 17, (17, 128)),
    ("list:8,16,128", 8, (0, 8)), ("list:8,16,128", 129, (129, 129)),
])
def test_bucket_policies(spec, value, bucket):
    p = parse_policy(spec)
    assert p.bucket(value) == bucket and parse_policy(p.spec()) == p


@pytest.mark.parametrize("bad", ["exp:x", "lin", "list:", "pow2", "lin:0", "exact:3"])
def test_bad_bucket_policy_is_a_clear_error(bad):
    with pytest.raises(BucketError, match="forms: exact"):
        parse_policy(bad)


def test_per_symbol_policies_and_warm_points():
    ps = policies_for((("*", "exact"), ("s1", "exp:16")), ["s0", "s1"])
    assert [p.kind for p in ps] == ["exact", "exp"]
    assert upper_points(parse_policy("exp:16"), 1, 100) == [16, 32, 64, 100]


def _gpt_calls(policy: str, lengths: list[int]):
    gpt = load_model_file("gpt")
    model = gpt.make_model(layers=1).eval()  # one block has every op two have: buckets and guards are the same
    compiled = torch.compile(model, backend="hpu_backend", dynamic=True,
                             options={"buckets": policy, "cache": False})
    with metric_localcontext("graph_compilation") as gc, torch.no_grad():
        for n in lengths:
            tokens, _ = gpt.make_inputs(1, n, seed=n)
            torch.testing.assert_close(compiled(tokens), model(tokens), msg=lambda m: f"length {n}: {m}")
    return dict(gc.stats())


@pytest.mark.e2e
@pytest.mark.parametrize("policy", ["exp", "exact"])
def test_gpt_200_random_lengths_compile_once_per_bucket(policy):
    rng = random.Random(7)
    lengths = [rng.randint(1, 512) for _ in range(200)] + [1]
    stats = _gpt_calls(policy, lengths)
    p = parse_policy(policy)
    buckets = {p.bucket(n) for n in lengths if n > 1}  # the dynamic graph's buckets
    specialized = 1  # Dynamo specializes length 1 into a graph of its own (one static recipe)
    assert stats["TotalNumber"] == len(buckets) + specialized
    if policy == "exp":
        assert len(buckets) <= 10
    reasons = stats["Reasons"]
    # The first graph is new; Dynamo's recompile for length 1 (or for ≥ 2) follows a failed guard.
    assert reasons == {"new graph": 1, "guard failure": 1, "new bucket": len(buckets) - 1}


@pytest.mark.e2e
def test_second_process_hits_the_disk_cache(tmp_path):
    code = (
        "import json, torch, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import load_model_file\n"
        "from hpu_backend.metrics import metric_global\n"
        "gpt = load_model_file('gpt'); m = gpt.make_model(layers=1).eval()\n"  # one block: the same buckets
        "c = torch.compile(m, backend='hpu_backend', dynamic=True)\n"
        "with torch.no_grad():\n"
        "    for n in [5, 17, 40, 90, 200, 33]:\n"
        "        t, _ = gpt.make_inputs(1, n); torch.testing.assert_close(c(t), m(t))\n"
        "print(json.dumps({k: v for k, v in metric_global('graph_compilation').stats()[:1] +"
        " metric_global('recipe_cache').stats()[:2]}))\n"
    )
    env = {"PT_HPU_RECIPE_CACHE_CONFIG": f"{tmp_path},false,64", "PYTHONHASHSEED": "1"}
    first = json.loads(run_python(code, env).strip().splitlines()[-1])
    env["PYTHONHASHSEED"] = "2"
    second = json.loads(run_python(code, env).strip().splitlines()[-1])
    assert first["TotalNumber"] == first["TotalMiss"] == 5  # buckets 8, 32, 64, 128, 256
    assert second == {"TotalNumber": 0, "TotalHit": 5, "TotalMiss": 0}


def _branchy(x):
    if x.shape[0] > 16:  # Dynamo records a guard on the size and traces one branch
        return x * 2 + 1
    return x * 2 + 1  # the same graph, under the opposite guard


def test_a_recipe_is_not_reused_where_its_guard_fails():
    compiled = torch.compile(_branchy, backend="hpu_backend", dynamic=True,
                             options={"buckets": "list:64", "cache": False})
    with collect_recipes() as found, metric_localcontext("graph_compilation") as gc:
        for n in (40, 8):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), _branchy(x))
    (g1, r1, _), (g2, r2, _) = found
    assert r1.bucket == r2.bucket == {"s0": [0, 64]}  # one bucket would serve both lengths...
    assert r1.guards != r2.guards  # ...but the guards differ, so the second recipe is compiled anew
    assert explain(g1.gkey.parts, g2.gkey.parts) == ["guards"]
    assert dict(gc.stats())["Reasons"] == {"new graph": 1, "guard failure": 1}
    with pytest.raises(GuardViolation, match="break the guard"):
        g1.on_new_values((8,))  # the runtime probe refuses values outside the recipe's guards


KEY_SCRIPT = (
    "import torch, sys\n"
    "from hpu_backend.serve.compiled import collect_recipes\n"
    "torch.manual_seed(int(sys.argv[1]))\n"
    "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))\n"
    "with collect_recipes() as found, torch.no_grad():\n"
    "    torch.compile(m, backend='hpu_backend', dynamic=True)(torch.randn(5, 8))\n"
    "print(*[g.key_of(r) for g, r, _ in found])\n"
)


@pytest.mark.e2e
def test_keys_are_stable_across_processes_and_hash_seeds():
    import subprocess
    import sys

    keys = set()
    for seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, seed], capture_output=True, text=True,
                             check=True, env={**__import__("os").environ, "PYTHONHASHSEED": seed})
        keys.add(out.stdout.strip())
    assert len(keys) == 1 and len(next(iter(keys))) == 32  # and weights differ between the two seeds


def _key(fn, x, options=None, dynamic=False):
    torch._dynamo.reset()
    with collect_recipes() as found, torch.no_grad():
        torch.compile(fn, backend="hpu_backend", dynamic=dynamic, options=options)(x)
    ((graph, recipe, _),) = found
    return graph.key_of(recipe), graph.gkey.for_bucket(recipe.bucket)[1]


def test_key_changes_name_the_part_that_changed():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    base_key, base = _key(lin, x)
    with torch.no_grad():
        lin.weight.add_(1.0)
    assert _key(lin, x)[0] == base_key  # a weight's value is not in the key
    cases = {
        "shape": (_key(lin, torch.randn(5, 4)), {"inputs"}),
        "dtype": (_key(lin.double(), x.double()), {"inputs"}),
        "op": (_key(lambda t: torch.nn.functional.relu(lin.float()(t)), x), {"graph"}),
        "setting": (_key(lin.float(), x, {"target": "gaudi3"}), {"settings"}),
        "policy": (_key(lin, x, {"buckets": "exact"}, dynamic=True), {"settings", "bucket"}),
    }
    dyn_key, dyn = _key(lin, x, dynamic=True)
    for name, ((key, parts), expected) in cases.items():
        reference = dyn if name == "policy" else base
        assert key not in (base_key, dyn_key), name
        assert expected <= set(explain(reference, parts)), (name, explain(reference, parts))
    assert set(explain(dyn, cases["policy"][0][1])) == {"settings", "bucket"}


def _gelu_sum(x):
    return torch.nn.functional.gelu(x) * 2 + x.sum()


def test_a_graph_keeps_as_many_buckets_as_the_memory_tier_and_takes_old_ones_up_again(tmp_path):
    from recipecache import CacheConfig

    config = CacheConfig(path=tmp_path / "c", memory_entries=2, fsync=False)
    compiled = torch.compile(_gelu_sum, backend="hpu_backend", dynamic=True,
                             options={"cache_config": config, "buckets": "exact"})
    with collect_recipes() as taken, metric_localcontext("graph_compilation") as gc:
        for n in (3, 4, 5, 6, 3):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), _gelu_sum(x))
    (graph,) = {id(g): g for g, _, _ in taken}.values()
    assert len(graph.buckets) == 2 and len(graph._executors) <= 2
    assert {values[0] for values in graph.known} == {3, 6}  # values of let-go buckets are forgotten with them
    # size 3 was let go after 5 and 6, then taken up again from the store: found, not compiled again
    assert [(r.bucket["s0"], hit) for _, r, hit in taken] == [
        ([3, 3], False), ([4, 4], False), ([5, 5], False), ([6, 6], False), ([3, 3], True)]
    assert dict(gc.stats())["TotalNumber"] == 4


def test_the_memo_of_symbol_values_is_bounded_too(tmp_path):
    from recipecache import CacheConfig

    config = CacheConfig(path=tmp_path / "c", memory_entries=1, fsync=False)
    compiled = torch.compile(_gelu_sum, backend="hpu_backend", dynamic=True,
                             options={"cache_config": config, "buckets": "exp"})
    with collect_recipes() as taken:
        for n in range(33, 64):  # one bucket, 31 distinct sizes
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), _gelu_sum(x))
    (graph,) = {id(g): g for g, _, _ in taken}.values()
    assert len(taken) == 1 and len(graph.buckets) == 1
    assert 0 < len(graph.known) <= 16


def test_a_memory_tier_turned_off_still_leaves_a_graph_its_working_set():
    from hpu_backend.serve.store import RecipeStore
    from recipecache import CacheConfig

    assert RecipeStore(None, 3).capacity == 3
    assert RecipeStore(None, 0).capacity == CacheConfig.memory_entries == 256
