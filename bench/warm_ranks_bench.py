"""One prebuild for all ranks: a TP-8 tiny LLaMA prebuilt once on this CPU box, shipped as a bundle, served by 8 ranks.

1. ``hpurecipe prebuild models/llama.py:TINY_TP --cards 8`` into an empty cache: every rank's shard traced as that
   rank, each unique graph compiled once (the compiles must equal the distinct recipes, not 8x them);
2. ``hpurecipe export`` of that cache and ``hpurecipe import`` into another, empty one (a deployment's path);
3. ``hpurecipe run --cards 8 models/gaudi/serve_tp.py`` over the imported cache: 8 launched processes, real
   collectives (gloo), each rank reporting its recipes found and compiled (0 compiled on every rank is the goal);
4. for scale, the same run over an empty cache (every rank compiles its graphs itself).

Writes bench/results/warm_ranks_bench.json and prints a table. ``--cards 4`` for a smaller machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = f"{ROOT / 'models' / 'llama.py'}:TINY_TP"
SERVE = ROOT / "models" / "gaudi" / "serve_tp.py"
AXES = ["batch=2", "input_len=16,32"]


def env(cache: Path | None = None) -> dict:
    out = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")]))
    if cache is not None:
        out["PT_HPU_RECIPE_CACHE_CONFIG"] = f"{cache},false,1024"
    return out


def hpurecipe(*args, cache: Path | None = None) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpurecipe.main", *map(str, args)], capture_output=True, text=True,
                          env=env(cache), cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"hpurecipe {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return done.stdout, time.perf_counter() - start


def serve(cache: Path, cards: int, report: Path) -> dict:
    _, wall = hpurecipe("run", "--cards", cards, "--report", report, SERVE, MODEL, *AXES, cache=cache)
    ranks = json.loads(report.read_text())["ranks"]
    return {"wall_s": round(wall, 1), "ranks": [{"rank": r["rank"], **r["recipe_cache"]} for r in ranks],
            "compiled": sum(r["recipe_cache"]["compiled"] for r in ranks),
            "hits": sum(r["recipe_cache"]["hits"] for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "warm_ranks_bench.json")
    args = parser.parse_args()
    axis = [x for a in AXES for x in ("--axis", a)]
    with tempfile.TemporaryDirectory() as tmp:
        built, shipped, bundle = Path(tmp, "built"), Path(tmp, "shipped"), Path(tmp, "tp.tar")
        out, wall = hpurecipe("prebuild", MODEL, "--cards", args.cards, *axis, "--json", "-d", built)
        prebuild = json.loads(out)
        hpurecipe("export", bundle, "--model", f"llama-tiny-tp{args.cards}", "-d", built)
        hpurecipe("import", bundle, "-d", shipped)
        served = serve(shipped, args.cards, Path(tmp, "served.json"))
        cold = serve(Path(tmp, "empty"), args.cards, Path(tmp, "cold.json"))
    doc = {"model": MODEL.replace(str(ROOT) + "/", ""), "axes": AXES, "cards": args.cards, "cpus": os.cpu_count(),
           "prebuild": {"wall_s": round(wall, 1), "seconds": prebuild["seconds"], "buckets": prebuild["buckets"],
                        "compiled": prebuild["compiled"], "hits": prebuild["hits"], "recipes": prebuild["recipes"],
                        "ranks": prebuild["ranks"]},
           "run_from_bundle": served, "run_cold": cold}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    p = doc["prebuild"]
    print(f"prebuild --cards {args.cards}: {p['buckets']} rank-points, {p['recipes']} distinct recipes, "
          f"{p['compiled']} compiled, {p['hits']} hits, {p['wall_s']} s")
    print(f"{'run --cards ' + str(args.cards):<28}{'compiled':>9}{'hits':>6}{'wall s':>8}  per rank (compiled/hits)")
    for name, r in (("from the imported bundle", served), ("from an empty cache", cold)):
        per = " ".join(f"{x['compiled']}/{x['hits']}" for x in r["ranks"])
        print(f"{name:<28}{r['compiled']:>9}{r['hits']:>6}{r['wall_s']:>8}  {per}")
    print(f"wrote {args.out}")
    ok = p["compiled"] == p["recipes"] and served["compiled"] == 0 and all(
        r["hits"] == p["recipes"] and r["program_misses"] == 0 for r in served["ranks"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
