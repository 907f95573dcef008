"""PyTorch's OpInfo samples through torch.compile: hpu_backend against eager, aot_eager as referee.

Run as a script for the full report: ``python tests/opinfo_sweep.py [--samples N] [--json FILE]``.
With ``--warm-cache``, every op that passes is run a second time from the recipe cache the first
pass filled (a fresh Dynamo and newly opened caches, as in a new process): it must pass again
with nothing lowered, and the report counts the ops served without an AOTAutograd trace.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import tempfile
import time
import warnings

import torch
import torch._dynamo
from torch.testing._internal.common_methods_invocations import op_db

SAMPLES = 2  # the first few samples per op

# Ops whose result is uninitialized memory: no two runs need agree, so there is nothing to compare.
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                           "new_empty_strided"})


@contextlib.contextmanager
def _no_test_lookup():
    """OpInfo's sample_inputs crawls the stack (inspect.stack(), which reads the source of every frame) for a
    unittest.TestCase to seed by test name. The sweep runs in none, so the crawl always finds nothing and the
    seed is the default one: skip the crawl (a tenth of a second per op under pytest's deep stack)."""
    import torch.testing._internal.common_utils as utils
    import torch.testing._internal.opinfo.core as core

    saved = utils.extract_test_fn, core.extract_test_fn
    utils.extract_test_fn = core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        utils.extract_test_fn, core.extract_test_fn = saved


def _call(op, sample):
    return op.op(sample.input, *sample.args, **sample.kwargs)


def _same(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b, equal_nan=True)
        return True
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return False


class _EagerFallbacks(logging.Handler):
    """Collects hpu_backend's "could not lower ... running it eagerly" warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if "could not lower" in message:
            self.reasons.append(message.split("eagerly: ", 1)[-1].splitlines()[0][:160])


def _run(backend, op, samples, cache_dir=None) -> str:
    """'pass', or a one-line reason. A graph hpu_backend ran eagerly (not lowered) is a failure;
    a CPU fallback of an op is not: that op still runs from the recipe."""
    torch._dynamo.reset()
    options = None
    if backend == "hpu_backend":
        options = {"cache_config": f"{cache_dir},false,4096"} if cache_dir else {"cache": False}
    fn = torch.compile(lambda s: _call(op, s), backend=backend, options=options)
    fallbacks = _EagerFallbacks()
    logging.getLogger("hpu_backend").addHandler(fallbacks)
    try:
        for s in samples:
            with torch.no_grad():
                expected = _call(op, s)
                got = fn(s)
            if fallbacks.reasons:
                return f"ran eagerly: {fallbacks.reasons[0]}"
            if not _same(got, expected):
                return "mismatch"
    except Exception as e:  # noqa: BLE001 - the sweep reports every failure kind
        lines = [line for line in str(e).splitlines() if line.strip() and not line.endswith("raised:")]
        return f"error: {type(e).__name__}: {(lines or [''])[0][:160]}"
    finally:
        logging.getLogger("hpu_backend").removeHandler(fallbacks)
    return "pass"


def _deterministic(op, samples) -> bool:
    """Eager runs and gives the same answer twice (random ops and ops this build lacks are out)."""
    try:
        with torch.no_grad():
            return all(_same(_call(op, s), _call(op, s)) for s in samples)
    except Exception:  # noqa: BLE001 - an op that cannot run eagerly here is not swept
        return False


def _run_warm(op, samples, cache_dir) -> str:
    """The second pass: 'pass' (served by a stored program), 'pass, traced' (recipes from the cache,
    AOTAutograd traced: no program for this graph), or why not."""
    from hpu_backend.metrics import metric_global

    def counts():
        cache = dict(metric_global("recipe_cache").stats())
        return dict(metric_global("graph_compilation").stats())["TotalNumber"], cache["ProgramMiss"]

    lowered, traced = counts()
    with _session(cache_dir):  # the cache opened anew, as a new process would
        result = _run("hpu_backend", op, samples, cache_dir)
    lowered, traced = (a - b for a, b in zip(counts(), (lowered, traced)))
    if result != "pass":
        return f"warm: {result}"
    if lowered:
        return f"warm: {lowered} recipes lowered again"
    return "pass, traced" if traced else "pass"


def sweep(ops=None, samples: int = SAMPLES, cache_dir=None):
    """{op name: (hpu result, aot_eager result or None if hpu passed)} over float32 CPU samples."""
    results = {}
    for op in ops if ops is not None else op_db:
        if torch.float32 not in op.supported_dtypes("cpu") or op.name in UNINITIALIZED:
            continue
        try:
            with _no_test_lookup():
                # only the first few: OpInfo reseeds before each sample, so they are the same however many follow
                chosen = list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=False), samples))
        except Exception:  # noqa: BLE001 - some OpInfos cannot make samples on this build
            continue
        if not chosen or not _deterministic(op, chosen):
            continue
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _session(cache_dir):
                ours = _run("hpu_backend", op, chosen, cache_dir)
            if cache_dir and ours == "pass":
                ours = _run_warm(op, chosen, cache_dir)
            referee = None if ours.startswith("pass") else _run("aot_eager", op, chosen)
        results[name] = (ours, referee)
    torch._dynamo.reset()
    return results


@contextlib.contextmanager
def _session(cache_dir):
    """Compile in a session of its own over ``cache_dir`` (none without one), flushed when the block ends: its
    background writes land before the next pass reads them, or the caller removes the directory."""
    if not cache_dir:
        yield
        return
    from hpu_backend.serve.session import Session
    from hpu_backend.settings import Settings

    session = Session.open(Settings.from_options({"cache_config": f"{cache_dir},false,4096"}))
    try:
        with session.use():
            yield
    finally:
        session.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--warm-cache", action="store_true", help="run each passing op again from the cache")
    args = ap.parse_args()
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep(samples=args.samples, cache_dir=f"{tmp}/recipes" if args.warm_cache else None)
    passed = sum(r[0].startswith("pass") for r in res.values())
    eligible = sum(r[0].startswith("pass") or r[1] == "pass" for r in res.values())
    print(f"{len(res)} ops swept in {time.time() - start:.0f} s; hpu_backend passes {passed}; "
          f"aot_eager-passing ops: {eligible}; hpu_backend passes {passed}/{eligible} of them")
    if args.warm_cache:
        traced = sum(r[0] == "pass, traced" for r in res.values())
        print(f"second pass from the warm cache: {passed} pass with nothing lowered; {passed - traced} of them "
              f"served by stored programs (no AOTAutograd trace), {traced} traced (no program stored)")
    for name, (ours, ref) in sorted(res.items()):
        if not ours.startswith("pass") and ref == "pass":
            print(f"  {name}: {ours}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
