"""N cards as a launcher starts them: N processes on loopback, each running the script as one rank.

Each rank gets the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and Open MPI's (``OMPI_COMM_WORLD_RANK`` and friends), so
scripts written for either find their rank. Ranks share our stdout; their stderr passes through a reader
that keeps each rank's last line, so that a failure is named in one line: the first rank to fail (or every
rank still running at ``--timeout``) stops the others, and ``RunError`` says which rank and why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..timeline.trace import rank_path
from . import report as reports
from .errors import RunError

RANK_ENV = "HPU_BACKEND_RUN_RANK"  # set in every rank: a stop (SIGTERM) still writes the rank's report
GRACE_S = 3.0  # how long a stopped rank gets to exit after SIGTERM (or Ctrl-C) before it is killed
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding hpu_backend, for the ranks


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen
    report: str
    last_line: str = ""
    ended_at: float | None = None  # monotonic time its stderr closed (it exited)
    reader: threading.Thread | None = field(default=None, repr=False)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one rank of ``world`` on this host."""
    env = dict(os.environ if base is None else base)
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world,
                        "GROUP_RANK": 0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                        "OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world,
                        "OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": world,
                        "OMPI_COMM_WORLD_NODE_RANK": 0}.items():
        env[name] = str(value)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env[RANK_ENV] = "1"
    return env


def run_ranks(script: str, args: list[str], cards: int, report: str | None, timeout: float | None,
              trace: str | None = None) -> int:
    """Run ``cards`` ranks of ``script`` to the end; 0 when all succeed, else ``RunError`` (one line)."""
    with tempfile.TemporaryDirectory(prefix="hpu_ranks_") as tmp:
        port = free_port()
        ranks = [_start(r, cards, port, script, args, tmp, trace) for r in range(cards)]
        try:
            _watch(ranks, timeout)
        except _Hung as hung:
            _stop(ranks)
            raise RunError(f"{hung}; all ranks were stopped{_where(ranks, hung.ranks)}") from None
        finally:
            _stop(ranks)
            _report(ranks, report)
    return 0


class _Hung(Exception):
    """Ranks still running at the timeout (``ranks``); stopped, they say where they were."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def _where(ranks: list[Rank], hung: list[int]) -> str:
    places = [f"rank {r.rank} at {(reports.read(r.report) or {}).get('stopped_at')}" for r in ranks
              if r.rank in hung and (reports.read(r.report) or {}).get("stopped_at")]
    return f" ({', '.join(places)})" if places else ""


def _start(rank: int, world: int, port: int, script: str, args: list[str], tmp: str, trace: str | None) -> Rank:
    path = os.path.join(tmp, f"rank{rank}.json")
    traced = ["--trace", rank_path(trace, rank, world)] if trace else []
    cmd = [sys.executable, "-m", "hpu_backend.run", "--report", path, *traced, script, *args]
    proc = subprocess.Popen(cmd, env=rank_env(rank, world, port), stderr=subprocess.PIPE)
    r = Rank(rank, proc, path)
    r.reader = threading.Thread(target=_relay, args=(r,), daemon=True)
    r.reader.start()
    return r


def _relay(r: Rank) -> None:
    """Copy a rank's stderr to ours line by line, keeping its last non-empty line (its error, if it fails)."""
    for raw in r.proc.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        if raw.strip():
            r.last_line = raw.decode(errors="replace").strip()
    r.ended_at = time.monotonic()


def _watch(ranks: list[Rank], timeout: float | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            failed = [r for r in ranks if r.proc.poll() not in (None, 0)]
            if failed:
                first = min(failed, key=lambda r: (_ended(r), r.rank))
                raise RunError(f"rank {first.rank} failed ({_why(first)}); the other ranks were stopped")
            if all(r.proc.poll() == 0 for r in ranks):
                return
            if deadline is not None and time.monotonic() > deadline:
                hung = [r.rank for r in ranks if r.proc.poll() is None]
                raise _Hung(f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} still running after "
                            f"{timeout:g} s (--timeout)", hung)
            time.sleep(0.05)
    except KeyboardInterrupt:
        raise RunError("interrupted; all ranks were stopped", 130) from None


def _ended(r: Rank) -> float:
    if r.reader is not None:
        r.reader.join(1.0)  # its stderr closes as it exits: that time orders the failures
    return r.ended_at if r.ended_at is not None else float("inf")


def _why(r: Rank) -> str:
    code = r.proc.returncode
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return r.last_line or f"exit code {code}"


def _stop(ranks: list[Rank]) -> None:
    """Stop every rank still running: SIGTERM, then SIGKILL after ``GRACE_S``."""
    alive = [r for r in ranks if r.proc.poll() is None]
    for r in alive:
        r.proc.terminate()
    end = time.monotonic() + GRACE_S
    for r in alive:
        try:
            r.proc.wait(max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
    for r in ranks:
        if r.reader is not None:
            r.reader.join(1.0)


def _report(ranks: list[Rank], path: str | None) -> None:
    per_rank = [reports.read(r.report) or {"rank": r.rank, "exit_code": r.proc.returncode, "report": None}
                for r in ranks]
    if path:
        reports.write({"world_size": len(ranks), "ranks": per_rank}, path)
        return
    sys.stdout.flush()
    for one in per_rank:
        lines = reports.render(one) if one.get("report", True) is not None else [
            f"── hpu_backend: rank {one['rank']}: no report (stopped, exit {one['exit_code']})"]
        print("\n".join(lines), file=sys.stderr, flush=True)
