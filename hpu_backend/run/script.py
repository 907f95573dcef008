"""One script, run in this process as ``python SCRIPT ARGS`` would run it, on the simulated device.

The script is ``__main__`` with its own ``sys.argv`` and its directory first on ``sys.path``; its stdout is its
own; an exception it raises prints its own traceback (as Python shows it: from the script's first frame,
without the launcher's) and exits 1; ``sys.exit(n)`` exits ``n``; Ctrl-C prints its ``KeyboardInterrupt``
traceback and exits 130, as Python does. At exit, whatever happened, the run's report
goes to stderr or to a JSON file (``report.py``).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from .. import envs
from ..errors import one_line
from .errors import RunError

_OURS = {os.path.abspath(runpy.__file__), os.path.abspath(__file__), "<frozen runpy>"}


def check_script(script: str) -> Path:
    """The script's path, or a one-line ``RunError`` if it is not a readable file."""
    path = Path(script)
    if not path.exists():
        raise RunError(f"{script}: no such script")
    if not path.is_file():
        raise RunError(f"{script}: not a file")
    return path


def run_script(script: str, args: list[str], report: str | None = None, trace: str | None = None) -> int:
    """Run ``script`` with ``args`` as ``__main__`` on the simulated device; the exit code it ends with."""
    from . import names
    from . import report as reports

    path = check_script(script)
    names.simulate()
    if envs.get("HPU_BACKEND_RUN_RANK"):  # a rank the launcher may stop: end like an exit, report included
        signal.signal(signal.SIGTERM, _stopped)
    sys.argv[:] = [str(path), *args]
    # The script's folder first, as ``python SCRIPT`` (replacing the launcher's own entry), carrying the names
    # into the processes the script spawns.
    sys.path[0:1] = [names.SpawnedPath(path.resolve().parent)]
    start, code = time.perf_counter(), 1
    try:
        code = _run(path)
    finally:
        facts = reports.collect(str(path), code, time.perf_counter() - start)
        if _stopped_at:
            facts["stopped_at"] = _stopped_at[0]
        if trace:
            facts["trace"] = reports.trace(trace)
        reports.finish(facts, report)
    return code


_stopped_at: list[str] = []  # where the script was when the launcher stopped this rank (its report says)


def _stopped(signum, frame) -> None:
    script = os.path.abspath(sys.argv[0])
    while frame is not None and os.path.abspath(frame.f_code.co_filename) != script:
        frame = frame.f_back
    if frame is not None:
        _stopped_at.append(f"{os.path.basename(script)}:{frame.f_lineno}")
    raise SystemExit(128 + signum)


def _run(path: Path) -> int:
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        return _exit_code(e.code)
    except KeyboardInterrupt as e:  # Python's own ending for Ctrl-C: the traceback, then 128 + SIGINT
        _print_script_traceback(e)
        return 128 + signal.SIGINT
    except BaseException as e:
        if _raised_by_us(e):  # the simulated device refused (out of memory, strict fallback): one line
            print(f"hpu_backend.run: error: {one_line(e)}{_where(e, path)}", file=sys.stderr)
        else:  # the script's own failure: its traceback, as Python prints it
            _print_script_traceback(e)
        return 1
    return 0


def _raised_by_us(e: BaseException) -> bool:
    """A named error of this project (its class is defined under ``hpu_backend``): the device's refusal of
    what the script asked, to be told in one line, not a traceback through the simulator's code."""
    return type(e).__module__.split(".")[0] == "hpu_backend"


def _where(e: BaseException, path: Path) -> str:
    """`` (at script.py:LINE)``: the script's last line on the way to the error, if any."""
    script, line, tb = os.path.abspath(path), None, e.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == script:
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else f" (at {path.name}:{line})"


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as Python does
    return 1


def _print_script_traceback(e: BaseException) -> None:
    tb = e.__traceback__
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(e), e, tb, file=sys.stderr)


def _ours(filename: str) -> bool:
    return filename in _OURS or os.path.abspath(filename) in _OURS
