"""``python -m hpu_backend.run [--cards N] [--report FILE] [--timeout S] [--target T] SCRIPT [ARGS...]``.

One card and no timeout: the script runs in this process (start-up is ``import torch`` and the device).
More cards, or a timeout: each rank is a process of its own (``ranks.py``) and this one watches them.
``hpurecipe run`` parses the same options and calls ``launch``.
"""

from __future__ import annotations

import argparse
import os
import sys

from .errors import RunError

TARGET_ENV = "HPU_BACKEND_TARGET"


def launch(script: str, args: list[str], cards: int = 1, report: str | None = None, timeout: float | None = None,
           target: str | None = None, trace: str | None = None) -> int:
    """Run ``script`` with ``args`` on ``cards`` simulated cards; the exit code (``RunError`` for our failures).
    ``trace``: write each rank's step timeline there as a Chrome/Perfetto trace (``-rankN`` added per rank)."""
    from .script import check_script

    if cards < 1:
        raise RunError(f"--cards must be 1 or more, got {cards}", 2)
    if timeout is not None and timeout <= 0:
        raise RunError(f"--timeout must be more than 0 seconds, got {timeout:g}", 2)
    check_script(script)
    if trace is not None:
        _check_trace(trace)
    if target is not None:
        _set_target(target)
    if cards == 1 and timeout is None:
        from .script import run_script

        _one_rank_env(os.environ)
        return run_script(script, args, report, trace)
    from .ranks import run_ranks

    return run_ranks(script, args, cards, report, timeout, trace)


def _one_rank_env(env) -> None:
    """One rank's torchrun variables where the caller set none: DeepSpeed and Accelerate read them to start a
    one-process group (without them DeepSpeed goes to MPI discovery and wants mpi4py)."""
    from .ranks import free_port

    if any(name in env for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        return  # started by mpirun: the rank is MPI's to say (initialize_distributed_hpu reads it)
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1"}
    for name, value in defaults.items():
        env.setdefault(name, value)
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(free_port())


def _check_trace(path: str) -> None:
    from ..timeline.trace import TraceError, check_writable

    try:
        check_writable(path)
    except TraceError as e:
        raise RunError(str(e), 2) from None


def _set_target(target: str) -> None:
    from ..settings import TARGETS

    if target not in TARGETS:
        raise RunError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}", 2)
    os.environ[TARGET_ENV] = target  # read by the device and the backend's settings, here and in every rank


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpu_backend.run", description="Run a Gaudi script on the "
                                "simulated hpu device, as `python SCRIPT ARGS` would, and report what it did.")
    p.add_argument("--cards", type=int, default=1, help="ranks to start (default 1)")
    p.add_argument("--report", metavar="FILE", help="write the report as JSON here instead of stderr")
    p.add_argument("--timeout", type=float, metavar="S", help="stop every rank when one runs longer than S seconds")
    p.add_argument("--target", help="the device to plan and estimate for: gaudi2 | gaudi3")
    p.add_argument("--trace", metavar="FILE", help="write the step timeline as a Chrome/Perfetto trace (one per rank)")
    p.add_argument("script", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        return launch(ns.script, ns.args, ns.cards, ns.report, ns.timeout, ns.target, ns.trace)
    except RunError as e:
        print(f"hpu_backend.run: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("hpu_backend.run: interrupted", file=sys.stderr)
        return 130
