"""One prebuild for all ranks: ``warm --cards N`` builds every rank of a tensor-parallel deployment in one process,
and ``hpurecipe run --cards N`` then serves every rank from that cache without a compile.

Ranks whose graphs are identical (the tiny LLaMA's shards) share their recipes: compiles equal the unique
graphs. A graph that differs per rank (a vocabulary-parallel embedding: each rank's slice starts at its own
offset, a constant of its graph) is built once per rank under its own key, and each launched rank serves its
own recipe, with outputs equal to its eager shard's. The suite runs 2 ranks (two launched processes); the
8-card run is ``bench/warm_ranks_bench.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import cli, cli_json
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.modelfiles.modelspec import ModelFileError
from hpu_backend.shipping.warm import warm
from recipecache import CacheConfig

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "models" / "gaudi" / "serve_tp.py"
LLAMA = f"{ROOT / 'models' / 'llama.py'}:TINY_TP"

# Megatron's vocabulary-parallel embedding: rank r holds tokens [r * n, (r + 1) * n); the others' rows are
# zero, and the all-reduce sums the ranks' rows. The rank is read in forward: a constant of each rank's graph.
PER_RANK = '''
import torch
import torch.distributed as dist

VOCAB, DIM = 32, 8


class VocabShard(torch.nn.Module):
    def __init__(self, cards, group):
        super().__init__()
        torch.manual_seed(0)
        self.rows, self.group = VOCAB // cards, group
        self.weight = torch.nn.Parameter(torch.randn(self.rows, DIM))

    def forward(self, tokens):
        local = tokens - dist.get_rank() * self.rows
        inside = (local >= 0) & (local < self.rows)
        x = torch.nn.functional.embedding(local.clamp(0, self.rows - 1), self.weight) * inside.unsqueeze(-1)
        return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", self.group))


def make_inputs(batch, seed=0):
    return (torch.arange(batch * 4).reshape(batch, 4) % VOCAB,)


def make_model():
    return torch.nn.Embedding(VOCAB, DIM)


def PER_CARD(cards, group, layers=None):
    return {"make_model": lambda: VocabShard(cards, group), "make_inputs": make_inputs, "AXES": AXES,
            "COMPILE": {"options": {"model": f"vocab-tp{cards}"}}}


AXES = {"batch": [8]}  # tokens 0-31: every rank's rows
'''


def launch(cache: Path, *args, cards: int = 2) -> list[dict]:
    """``hpurecipe run --cards N`` of the serving script over ``cache``; every rank's report."""
    report = cache.parent / "run.json"
    env = dict(os.environ, PT_HPU_RECIPE_CACHE_CONFIG=f"{cache},false,256",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "hpu_backend.run", "--cards", str(cards), "--report", str(report),
                           str(SERVE), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())["ranks"]


def test_llama_tp_ranks_share_one_prebuild_and_run_without_compiles(tmp_path):
    cache = tmp_path / "cache"
    out = cli_json("prebuild", LLAMA, "--cards", 2, "--axis", "batch=2", "--axis", "input_len=16,32", "-d", cache)
    assert out["cards"] == 2 and out["buckets"] == 4
    assert out["compiled"] == out["recipes"] == 2  # each unique graph compiled once, not once per rank
    rank0, rank1 = out["ranks"]
    assert rank0 == {"rank": 0, "compiled": 2, "hits": 0, "recipes": 2, "same_as": 0}
    assert rank1 == {"rank": 1, "compiled": 0, "hits": 2, "recipes": 2, "same_as": 0}
    manifest = json.loads((cache / "manifests" / "llama-tiny-tp2.inference.json").read_text())
    assert sorted(manifest["buckets"]) == ["batch=2 input_len=16", "batch=2 input_len=32"]

    ranks = launch(cache, LLAMA, "batch=2", "input_len=16,32")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:  # every rank: all from the cache, nothing lowered, no graph traced by AOTAutograd
        assert r["recipe_cache"] == {"hits": 2, "compiled": 0, "program_hits": 2, "program_misses": 0}, r
        assert "cache_missed" not in r


def test_a_graph_that_differs_per_rank_is_never_shared(tmp_path):
    model_file = tmp_path / "vocab.py"
    model_file.write_text(PER_RANK)
    cache = tmp_path / "cache"
    report = warm(load_model_file(model_file), CacheConfig(path=str(cache), max_size_mb=256), cards=2, check=True)
    summary = report.summary()
    assert summary["mismatches"] == 0
    rank0, rank1 = summary["ranks"]
    assert rank1["same_as"] == 1 and rank1["compiled"] == rank0["compiled"] > 0 and rank1["hits"] == 0
    keys = [{k for p in report.points if p.rank == r for k in p.keys} for r in (0, 1)]
    assert keys[0] and not keys[0] & keys[1]  # no recipe of one rank serves the other

    ranks = launch(cache, model_file, "--check")  # each rank's output equals its eager shard's
    for r in ranks:
        assert r["recipe_cache"]["compiled"] == 0 and r["recipe_cache"]["hits"] == len(keys[r["rank"]]), r


def test_cards_need_a_shard_and_one_process(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ModelFileError, match="needs PER_CARD"):
        warm(load_model_file(ROOT / "models" / "mnist.py"), CacheConfig(path=str(cache)), cards=2)
    result = cli("prebuild", LLAMA, "--cards", 2, "-j", 2, "-d", cache, code=2)
    assert "drop --jobs" in result.output
    result = cli("warm", LLAMA, "--cards", 2, "--serving-plan", tmp_path / "plan.json", "-d", cache, code=2)
    assert "--cards" in result.output


def test_the_reports_name_ranks_that_share_and_what_each_rank_compiled():
    from hpu_backend.run import report as run_report
    from hpurecipe.warmreport import shared_ranks

    ranks = [{"rank": 0, "recipes": 2, "same_as": 0}, {"rank": 1, "recipes": 2, "same_as": 0},
             {"rank": 2, "recipes": 3, "same_as": 2}, {"rank": 3, "recipes": 2, "same_as": 0}]
    assert shared_ranks(ranks) == "ranks 0, 1, 3 use the same 2 recipes; rank 2 uses its own 3 recipes"
    assert shared_ranks(ranks[:2]) == "ranks 0-1 use the same 2 recipes"
    lines = run_report.render({"rank": 1, "world_size": 2, "steps": [{"step": 0, "ops": 3}],
                               "recipe_cache": {"hits": 2, "compiled": 0, "program_hits": 2, "program_misses": 0}})
    assert "   recipe cache: 2 recipes found, 0 compiled; programs: 2 found, 0 traced" in lines
    quiet = run_report.render({"steps": [{"step": 0, "ops": 3}], "recipe_cache": dict.fromkeys(
        ("hits", "compiled", "program_hits", "program_misses"), 0)})
    assert not any("recipe cache" in line for line in quiet)  # a run that compiled nothing says nothing of it
