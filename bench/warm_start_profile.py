"""Where a warm start spends its time: the warm-cache hit, the precompiled start and the package start, by phase.

Each case is a fresh process (``OMP_NUM_THREADS=1``), timed from just after building the model to the first
output, best of ``--repeat`` rounds (each round runs every case once, so that a load that drifts on a shared
machine hits every case alike). Cases, per model (models/gpt.py b1 s32 and the tiny Hugging Face GPT-2 of
models/hf_gpt2.py b2 s32, inference, dynamic shapes):

- ``dynamo`` (``backend="eager"``, Dynamo alone) and ``aot_eager``, the references; ``warm``: hpu_backend with a
  warm recipe cache (a stored program hit);
- ``dynamo, imported`` and ``precompiled``: the same with ``torch._dynamo`` imported before the clock starts, as
  in a serving process (any process importing ``transformers`` has); ``load_precompiled`` then the first call;
- ``package``: ``load_package`` then the first call (Dynamo is never imported).

Each timed run also records the garbage collector's pauses after the clock starts (``gc_s``; ``gc_full_s``: the
full collections, which walk every object the process holds: torch's own, after ``import torch``).

Then one more run of each of our cases under cProfile (the phases: imports, artifact read and verification,
torch's deserialize, guard building, program rebuild, the first call, and the self time in sympy and ShapeEnv)
and one under ``-X importtime`` (what is imported after the clock starts, by top-level package). The profiled
runs are slower than the timed ones (cProfile's overhead): read their phases as shares.

How the project's modules are loaded is part of the result: ``--bytecode none`` removes the checkout's
``__pycache__`` and sets ``PYTHONDONTWRITEBYTECODE=1`` (an editable install that never writes bytecode, where
every start compiles our sources); ``--bytecode compiled`` (default) compiles them first, as a wheel install does.
Writes bench/results/warm_start_profile.json (``--quick``: one model, fewer runs, ``_quick.json``).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

from common import ROOT, print_table, write_results
from first_call_bench import BENCH_KEY, POINTS, build_packages

PROJECT_PACKAGES = ("hpu_backend", "recipecache", "cli")
MARK = "-- clock starts --"

CHILD = r"""
import json, os, sys, time
import torch
bench, case, name, artifact, profile, module = sys.argv[1:7]
import importlib.util
found = importlib.util.spec_from_file_location(module, f"{bench}/../models/{name}.py")
spec = sys.modules[module] = importlib.util.module_from_spec(found)  # named as precompile named it
found.loader.exec_module(spec)
inputs = spec.make_inputs(*POINTS[name])[:spec.MODEL_INPUTS]
model = spec.make_model().eval()
if case in ("dynamo, imported", "precompiled"):
    import torch._dynamo, torch._dynamo.aot_compile  # a serving process has Dynamo imported already
before = set(sys.modules)
import gc
collections = []  # the garbage collector's pauses after the clock starts: [generation, seconds]
def timed_collection(phase, info, began=[0.0]):
    if phase == "start":
        began[0] = time.perf_counter()
    else:
        collections.append([info["generation"], time.perf_counter() - began[0]])
gc.callbacks.append(timed_collection)
profiler = None
if profile == "cprofile":
    import cProfile
    profiler = cProfile.Profile()
print(MARK, file=sys.stderr, flush=True)
start = time.perf_counter()
if profiler is not None:
    profiler.enable()
if case == "package":
    import hpu_backend
    compiled = hpu_backend.load_package(artifact, model)
elif case == "precompiled":
    import hpu_backend
    compiled = hpu_backend.load_precompiled(artifact, model)
else:
    backend = {"dynamo": "eager", "dynamo, imported": "eager", "aot_eager": "aot_eager"}.get(case, "hpu_backend")
    compiled = torch.compile(model, backend=backend, dynamic=True)
loaded = time.perf_counter()
with torch.no_grad():
    out = compiled(*inputs)
first = time.perf_counter()
if profiler is not None:
    profiler.disable()
gc.callbacks.remove(timed_collection)
doc = {"first_s": first - start, "load_s": loaded - start, "call_s": first - loaded,
       "gc_s": sum(s for _, s in collections), "gc_full_s": sum(s for g, s in collections if g == 2),
       "imported_modules": len(set(sys.modules) - before), "dynamo_imported": "torch._dynamo" in sys.modules}
if "hpu_backend.metrics" in sys.modules:
    doc["phases"] = sys.modules["hpu_backend.metrics"].phase_times()
if profiler is not None:
    import pstats
    doc["stats"] = [[f, l, fn, cc, nc, tt, ct] for (f, l, fn), (cc, nc, tt, ct, _) in
                    pstats.Stats(profiler).stats.items()]
print(json.dumps(doc))
"""

# inclusive time of these functions under cProfile: (file suffix, function name) -> phase
INCLUSIVE = {
    ("<frozen importlib._bootstrap>", "_find_and_load"): "imports",
    ("formats/precompiled.py", "read_manifest"): "artifact read + verify",
    ("formats/precompiled.py", "read_artifact"): "artifact read + verify",
    ("formats/package.py", "read_package"): "artifact read + verify",
    ("formats/signed.py", "read_signed"): "artifact read + verify",
    ("_dynamo/aot_compile.py", "deserialize"): "unpickle (torch's deserialize)",
    ("_dynamo/guards.py", "build_guards"): "guard building",
    ("serve/programs.py", "serve"): "program rebuild (stored program)",
    ("serve/keys.py", "program_key"): "program key",
    ("runtime/packaged.py", "check_package"): "package checks",
    ("runtime/executor.py", "build_callable"): "executor build",
    ("shipping/precompiled.py", "_check_sources"): "check: inlined sources",
    ("formats/signed.py", "check_header"): "check: signature (HMAC)",
    ("formats/precompiled.py", "check_fingerprint"): "check: fingerprint",
    ("shipping/precompiled.py", "check_parameters"): "check: parameters",
    ("shipping/precompiled.py", "module_difference"): "check: modules and hooks",
    ("runtime/metacheck.py", "check_call"): "check: recipe on meta tensors",
    ("serve/compiled.py", "_check_guards"): "check: recipe guards",
    ("runtime/executor.py", "check_ops"): "check: ops allowlist",
}
# self time by where the code lives: path fragment -> area (first match)
AREAS = (("/sympy/", "sympy"), ("symbolic_shapes.py", "ShapeEnv"), ("/torch/utils/_sympy/", "ShapeEnv"),
         ("<frozen importlib", "import machinery"), ("<built-in method marshal", "import machinery"),
         ("<built-in method builtins.compile>", "import machinery"), ("<built-in method _imp.", "import machinery"),
         ("/hpu_backend/", "hpu_backend"), ("/recipecache/", "hpu_backend"), ("/torch/_dynamo/", "Dynamo"),
         ("/transformers/", "transformers"), ("/torch/", "torch (other)"))


def profile_phases(stats: list) -> dict:
    """From cProfile's rows: inclusive seconds per phase (INCLUSIVE) and self seconds per area (AREAS)."""
    inclusive: dict[str, float] = {}
    areas: dict[str, float] = {}
    for file, _, fn, _, _, tt, ct in stats:
        phase = next((p for (suffix, name), p in INCLUSIVE.items() if fn == name and file.endswith(suffix)), None)
        if phase:
            inclusive[phase] = inclusive.get(phase, 0.0) + ct
        where = file if file != "~" else fn
        area = next((a for frag, a in AREAS if frag in where), "other")
        areas[area] = areas.get(area, 0.0) + tt
    return {"inclusive_s": inclusive, "self_s_by_area": dict(sorted(areas.items(), key=lambda kv: -kv[1]))}


def import_times(stderr: str) -> dict:
    """``-X importtime`` after the clock: cumulative seconds per top-level package, for imports of top level
    (those not nested in another one measured)."""
    out: dict[str, float] = {}
    for line in stderr.split(MARK, 1)[-1].splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        if parts[2].startswith("  "):  # nested: counted in its parent's cumulative time
            continue
        top = parts[2].strip().split(".")[0]
        out[top] = out.get(top, 0.0) + int(parts[1]) / 1e6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run(case: str, name: str, artifact: str, env: dict, profile: str = "") -> dict:
    code = f"POINTS = {POINTS!r}\nMARK = {MARK!r}\n" + CHILD
    flags = ["-X", "importtime"] if profile == "importtime" else []
    proc = subprocess.run([sys.executable, *flags, "-c", code, str(ROOT / "bench"), case, name, artifact, profile,
                           model_module(name)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{case} on {name} failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    if profile == "importtime":
        doc["imports_s"] = import_times(proc.stderr)
    return doc


def model_module(name: str) -> str:
    """The module name ``hpurecipe precompile`` gives the model file (its artifacts record the model's class under
    it), so that every case loads the model the same way."""
    from hpu_backend.modelfiles import modelfile

    path = ROOT / "models" / f"{name}.py"
    return f"hpurecipe_model_{modelfile._stem_label(str(path))}_{modelfile._hash(path)[:8]}"


def prepare_bytecode(mode: str, env: dict) -> dict:
    """Compile the project's sources (``compiled``) or remove their bytecode and keep it from being written."""
    for pkg in PROJECT_PACKAGES:
        path = ROOT / pkg
        if mode == "compiled":
            compileall.compile_dir(str(path), quiet=1)
        else:
            for cache in path.rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
    if mode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return {"bytecode": mode, "PYTHONDONTWRITEBYTECODE": env.get("PYTHONDONTWRITEBYTECODE", ""),
            "install": "checkout first on PYTHONPATH (editable)"}


CASES = ("dynamo", "aot_eager", "warm", "dynamo, imported", "precompiled", "package")
OURS = ("warm", "precompiled", "package")


def measure(name: str, repeat: int, env: dict, tmp: str) -> dict:
    artifacts = build_packages(name, tmp, with_aoti=False)
    artifacts = {"package": artifacts["package"], "precompiled": artifacts["precompiled"]}
    run("warm", name, "", env)  # fills the recipe cache (the stored program and its recipes)
    runs: dict[str, list] = {case: [] for case in CASES}
    for _ in range(repeat):  # the cases in turn, round after round: a load that drifts hits every case alike
        for case in CASES:
            runs[case].append(run(case, name, artifacts.get(case, ""), env))
    results = {}
    for case in CASES:
        best = min(runs[case], key=lambda r: r["first_s"])
        best["runs_s"] = [round(r["first_s"], 4) for r in runs[case]]
        if case in OURS:
            profiled = run(case, name, artifacts.get(case, ""), env, "cprofile")
            best["profile"] = profile_phases(profiled.pop("stats"))
            best["profile"]["first_s"] = profiled["first_s"]
            best["imports_s"] = run(case, name, artifacts.get(case, ""), env, "importtime")["imports_s"]
        results[case] = best
    first = {case: r["first_s"] for case, r in results.items()}
    results["ratios"] = {
        "warm / dynamo": first["warm"] / first["dynamo"], "warm / aot_eager": first["warm"] / first["aot_eager"],
        "precompiled / dynamo (imported)": first["precompiled"] / first["dynamo, imported"],
        "precompiled / aot_eager": first["precompiled"] / first["aot_eager"],
        "package / aot_eager": first["package"] / first["aot_eager"]}
    return results


TARGETS = {"warm / dynamo": 1.10, "warm / aot_eager": 0.60, "precompiled / dynamo (imported)": 0.10,
           "precompiled / aot_eager": 0.05, "package / aot_eager": 0.04}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="gpt only, 2 runs per case (a smoke run)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per case (the best is taken)")
    ap.add_argument("--models", default="gpt,hf_gpt2", help="model files of models/ (hf_gpt2 needs transformers)")
    ap.add_argument("--bytecode", choices=("compiled", "none"), default="compiled",
                    help="compile the project's sources first (a wheel install), or run them without bytecode")
    args = ap.parse_args()
    models = ["gpt"] if args.quick else args.models.split(",")
    repeat = 2 if args.quick else args.repeat
    env = dict(os.environ, OMP_NUM_THREADS="1", HPURECIPE_BUNDLE_KEY=BENCH_KEY,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")]))
    os.environ["HPURECIPE_BUNDLE_KEY"] = BENCH_KEY  # the artifacts are signed, as in a deployment
    torch.set_num_threads(1)  # built at the thread count it is served at: Dynamo's guards check it
    install = prepare_bytecode(args.bytecode, env)
    load_before = os.getloadavg()  # the machine's load (1, 5, 15 min): a shared machine slows every case
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        env["PT_HPU_RECIPE_CACHE_CONFIG"] = f"{tmp}/recipes,false,1024"
        os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] = env["PT_HPU_RECIPE_CACHE_CONFIG"]
        for name in models:
            results[name] = measure(name, repeat, env, tmp)
    rows = [[name, case, r["first_s"], r["load_s"], r["call_s"], r["gc_full_s"], r["imported_modules"]]
            for name, by_case in results.items() for case, r in by_case.items() if case != "ratios"]
    print_table(f"first result (s), fresh process, best of {repeat}, OMP_NUM_THREADS=1, bytecode {args.bytecode}",
                ["model", "case", "first", "load", "first call", "full GC", "modules imported"], rows)
    phases = sorted({p for by_case in results.values() for c in OURS for p in by_case[c]["profile"]["inclusive_s"]})
    print_table("under cProfile: inclusive seconds per phase", ["model", "case", "total", *phases],
                [[name, c, by_case[c]["profile"]["first_s"],
                  *(by_case[c]["profile"]["inclusive_s"].get(p, 0.0) for p in phases)]
                 for name, by_case in results.items() for c in OURS])
    print_table("ratios (target)", ["model", *TARGETS], [[name, *(f"{by_case['ratios'][k]:.3f} (≤{t})"
                                                                  for k, t in TARGETS.items())]
                                                          for name, by_case in results.items()])
    out = write_results("warm_start_profile" + ("_quick" if args.quick else ""),
                        {"repeat": repeat, "omp_num_threads": 1, "install": install, "targets": TARGETS,
                         "load_average": {"before": load_before, "after": os.getloadavg()}, "results": results})
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
