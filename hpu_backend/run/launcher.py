"""``python -m hpu_backend.run [--cards N] [--report FILE] [--timeout S] [--target T] SCRIPT [ARGS...]``.

One card and no timeout: the script runs in this process (start-up is ``import torch`` and the device).
More cards, or a timeout: each rank is a process of its own (``ranks.py``) and this one watches them.
``hpurecipe run`` parses the same options and calls ``launch``. Everything the run will need is checked
before it starts (options, the environment, the report's and the trace's folders), each in one line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from .. import envs
from .errors import RunError

TARGET_ENV = "HPU_BACKEND_TARGET"
GRACE_HELPERS_S = 2.0  # how long the helpers a rank leaves get after SIGTERM before SIGKILL
RANK_BYTES = 300 * 10 ** 6  # what one rank's interpreter holds once torch and the device are imported (~225 MB)


def launch(script: str, args: list[str], cards: int = 1, report: str | None = None, timeout: float | None = None,
           target: str | None = None, trace: str | None = None, prefix: bool = False,
           oversubscribe: bool = False) -> int:
    """Run ``script`` with ``args`` on ``cards`` simulated cards; the exit code (``RunError`` for our failures).
    ``trace``: write each rank's step timeline there as a Chrome/Perfetto trace (``-rankN`` added per rank).
    ``prefix``: start each line a rank prints with ``[rankN]: ``. ``oversubscribe``: start more ranks than the
    machine's memory holds."""
    from . import environment
    from .script import check_script

    _check_cards(cards, oversubscribe)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise RunError(f"--timeout must be a number of seconds more than 0, got {timeout:g}", 2)
    in_ranks = cards > 1 or timeout is not None
    if target is not None:
        _set_target(target)
    environment.check(ranks_started_here=in_ranks)
    check_script(script)
    if report is not None:
        _check_report(report)
    if trace is not None:
        _check_trace(trace, cards if in_ranks else 1)
    if not in_ranks:
        _one_rank_env(os.environ)
        return _run_here(script, args, report, trace)
    from .ranks import run_ranks

    return run_ranks(script, args, cards, report, timeout, trace, prefix)


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


def _run_here(script: str, args: list[str], report: str | None, trace: str | None) -> int:
    """The script in this process; when it fails, the processes it started and left running go with it."""
    from . import group
    from .script import run_script

    before = group.children()
    code = run_script(script, args, report, trace)
    if code:
        group.stop_new_children(before, GRACE_HELPERS_S)
    return code


def _check_cards(cards: int, oversubscribe: bool) -> None:
    if cards < 1:
        raise RunError(f"--cards must be 1 or more, got {cards}", 2)
    most = max_cards()
    if cards > most and not oversubscribe:
        raise RunError(f"--cards {cards} needs about {cards * RANK_BYTES / 1e9:.1f} GB ({RANK_BYTES // 10 ** 6} MB "
                       f"per rank) and this machine has {_available() / 1e9:.1f} GB available: use --cards {most} "
                       "or fewer, or pass --oversubscribe", 2)


def max_cards() -> int:
    """The ranks this machine's available memory holds (at least 1)."""
    return max(1, _available() // RANK_BYTES)


def _available() -> int:
    """Bytes of memory available to new processes: ``MemAvailable`` on Linux, else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux: the free pages are the nearest measure
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_report(path: str) -> None:
    """The report is written when the run ends: its folder is checked now, not after a long job."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise RunError(f"--report {path}: is a directory (give a file name)", 2)
    if not os.path.isdir(folder):
        raise RunError(f"--report {path}: no such directory {folder}", 2)
    if not os.access(folder, os.W_OK):
        raise RunError(f"--report {path}: not writable (read-only file system or no permission)", 2)


def _check_trace(path: str, world: int) -> None:
    from ..timeline.trace import TraceError, check_writable, rank_path

    try:
        for rank in range(world):
            check_writable(rank_path(path, rank, world))
    except TraceError as e:
        raise RunError(str(e), 2) from None


def _set_target(target: str) -> None:
    from ..settings import TARGETS

    if target not in TARGETS:
        raise RunError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}", 2)
    os.environ[TARGET_ENV] = target  # read by the device and the backend's settings, here and in every rank


class _OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (argparse prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m hpu_backend.run", description="Run a Gaudi script on the "
                                "simulated hpu device, as `python SCRIPT ARGS` would, and report what it did.")
    p.add_argument("--cards", type=int, default=1, help="ranks to start (default 1)")
    p.add_argument("--report", metavar="FILE", help="write the report as JSON here instead of stderr")
    p.add_argument("--timeout", type=float, metavar="S", help="stop every rank when one runs longer than S seconds")
    p.add_argument("--target", help="the device to plan and estimate for: gaudi2 | gaudi3")
    p.add_argument("--trace", metavar="FILE", help="write the step timeline as a Chrome/Perfetto trace (one per rank)")
    p.add_argument("--prefix", action="store_true", help="start each line a rank prints with [rankN]: ")
    p.add_argument("--oversubscribe", action="store_true",
                   help=f"start more ranks than memory holds (each needs about {RANK_BYTES // 10 ** 6} MB)")
    p.add_argument("script", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    from . import group
    from .ranks import RANK_ENV

    rank = envs.get(RANK_ENV)
    if rank and not group.follow_parent():
        return 128 + 15  # the launcher died before this rank started: end as its SIGTERM would have ended us
    ns = parser().parse_args(argv)
    try:
        return launch(ns.script, ns.args, ns.cards, ns.report, ns.timeout, ns.target, ns.trace, ns.prefix,
                      ns.oversubscribe)
    except RunError as e:
        print(f"hpu_backend.run: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("hpu_backend.run: interrupted", file=sys.stderr)
        return 130
    finally:
        if rank:
            group.stop_helpers(GRACE_HELPERS_S)
