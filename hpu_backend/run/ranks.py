"""N cards as a launcher starts them: N processes on loopback, each running the script as one rank.

Each rank gets the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and Open MPI's (``OMPI_COMM_WORLD_RANK`` and friends), so
scripts written for either find their rank. Ranks share our stdout; their stderr passes through a reader
that keeps each rank's last line, so that a failure is named in one line: the first rank to fail (or every
rank still running at ``--timeout``) stops the others, and ``RunError`` says which rank and why. With
``prefix``, every line a rank prints (stdout and stderr) starts ``[rankN]: ``, as torchrun's ``--tee`` shows.
DDP's warning that it keeps no time stats for a device without a C++ timer (the simulated hpu) is dropped.

The launcher owns its ranks (``group.py``): each leads its own process group, with its helpers, and dies with
the launcher; SIGTERM or Ctrl-C to the launcher stops every group before it exits (143, 130).
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
from . import group, report as reports
from .errors import RunError

RANK_ENV = "HPU_BACKEND_RUN_RANK"  # set in every rank: a stop (SIGTERM) still writes the rank's report
# DDP's reducer says this once per rank for any device without a C++ timer in c10d's TimerRegistry: Gaudi's bridge
# registers one for hpu, a simulated device cannot (it has no C++ part), so the line is ours to drop.
NO_TIMER_WARNING = b"Time stats are currently only collected for CPU and CUDA devices"
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
    out_reader: threading.Thread | None = field(default=None, repr=False)  # its stdout's, with a prefix


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
    env[group.PARENT_ENV] = str(os.getpid())
    return env


def run_ranks(script: str, args: list[str], cards: int, report: str | None, timeout: float | None,
              trace: str | None = None, prefix: bool = False) -> int:
    """Run ``cards`` ranks of ``script`` to the end; 0 when all succeed, else ``RunError`` (one line)."""
    with tempfile.TemporaryDirectory(prefix="hpu_ranks_") as tmp, _TermAsInterrupt():
        port = free_port()
        ranks: list[Rank] = []
        stop_with = signal.SIGTERM
        try:
            for r in range(cards):
                ranks.append(_start(r, cards, port, script, args, tmp, trace, prefix))
            _watch(ranks, timeout)
        except _Hung as hung:
            _stop(ranks)
            raise RunError(f"{hung}; all ranks were stopped{_where(ranks, hung.ranks)}") from None
        except _Interrupted as e:
            stop_with = signal.SIGINT  # as a terminal's Ctrl-C reaches every process of a job
            raise RunError(f"interrupted ({e}); all ranks were stopped", e.code) from None
        finally:
            _stop(ranks, stop_with)
            _report(ranks, report)
    return 0


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM to the launcher while its ranks run; ``code``: the exit code it ends with."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


class _TermAsInterrupt:
    """While ranks run, SIGTERM (and SIGINT, as Ctrl-C) to the launcher raise ``_Interrupted``: the ranks are
    stopped before it exits, not orphaned."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        in_main = threading.current_thread() is threading.main_thread()  # only it may set handlers
        self.saved = {s: signal.signal(s, self._raise) for s in self.SIGNALS} if in_main else {}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.saved.items():
            signal.signal(s, handler)

    def _raise(self, signum, frame) -> None:
        for s in self.SIGNALS:  # a second Ctrl-C must not cut the stopping of the ranks short
            signal.signal(s, signal.SIG_IGN)
        raise _Interrupted(signum)


class _Hung(Exception):
    """Ranks still running at the timeout (``ranks``); stopped, they say where they were."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def _where(ranks: list[Rank], hung: list[int]) -> str:
    places = [f"rank {r.rank} at {(reports.read(r.report) or {}).get('stopped_at')}" for r in ranks
              if r.rank in hung and (reports.read(r.report) or {}).get("stopped_at")]
    return f" ({', '.join(places)})" if places else ""


def _start(rank: int, world: int, port: int, script: str, args: list[str], tmp: str, trace: str | None,
           prefix: bool) -> Rank:
    path = os.path.join(tmp, f"rank{rank}.json")
    traced = ["--trace", rank_path(trace, rank, world)] if trace else []
    cmd = [sys.executable, "-m", "hpu_backend.run", "--report", path, *traced, script, *args]
    # A session of its own: the rank leads a process group holding every helper it forks (stopped as one), and
    # a Ctrl-C at the terminal reaches the launcher only, which stops the ranks in order.
    proc = subprocess.Popen(cmd, env=rank_env(rank, world, port), stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE if prefix else None, start_new_session=True)
    r = Rank(rank, proc, path)
    head = f"[rank{rank}]: ".encode() if prefix else b""
    r.reader = threading.Thread(target=_relay, args=(r, head), daemon=True)
    r.reader.start()
    if prefix:
        r.out_reader = threading.Thread(target=_copy, args=(proc.stdout, sys.stdout, head), daemon=True)
        r.out_reader.start()
    return r


def _relay(r: Rank, head: bytes) -> None:
    """Copy a rank's stderr to ours line by line, keeping its last non-empty line (its error, if it fails)."""
    for raw in r.proc.stderr:
        if NO_TIMER_WARNING in raw:
            continue
        sys.stderr.buffer.write(head + raw)
        sys.stderr.buffer.flush()
        if raw.strip():
            r.last_line = raw.decode(errors="replace").strip()
    r.ended_at = time.monotonic()


def _copy(source, to, head: bytes) -> None:
    """A rank's stdout to ours, ``head`` before each line (whole lines: ranks' lines never interleave)."""
    for raw in source:
        to.buffer.write(head + raw)
        to.buffer.flush()


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
    except KeyboardInterrupt:  # a Ctrl-C that came before our handler was in place
        raise _Interrupted(signal.SIGINT) from None


def _ended(r: Rank) -> float:
    if r.reader is not None:
        r.reader.join(1.0)  # its stderr closes as it exits: that time orders the failures
    return r.ended_at if r.ended_at is not None else float("inf")


def _why(r: Rank) -> str:
    code = r.proc.returncode
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return r.last_line or f"exit code {code}"


def _stop(ranks: list[Rank], first: int = signal.SIGTERM) -> None:
    """Stop every rank still running and every helper a rank left (its process group): ``first``, then SIGKILL
    after ``GRACE_S``."""
    for r in ranks:
        if r.proc.poll() is None:
            _signal_group(r, first)
    end = time.monotonic() + GRACE_S
    for r in ranks:
        try:
            r.proc.wait(max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            _signal_group(r, signal.SIGKILL)
            r.proc.wait()
    for r in ranks:  # a rank's group outlives it while a helper it forked runs on (its id stays reserved)
        group.stop(r.proc.pid, max(end - time.monotonic(), 0.5))
    for r in ranks:
        for reader in (r.reader, r.out_reader):
            if reader is not None:
                reader.join(1.0)


def _signal_group(r: Rank, sig: int) -> None:
    try:
        os.killpg(r.proc.pid, sig)
    except ProcessLookupError:  # the rank and every process of its group have ended
        pass


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
