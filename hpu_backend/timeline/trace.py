"""Chrome/Perfetto trace JSON of a timeline, laid out as Gaudi's profiler lays out an HPU trace, and a reader
that streams one (a 100 MB trace is never loaded whole).

Layout: a ``/device:HPU:N`` process with a row per engine (``Recipe``, ``MME``, ``TPC``, ``DMA``,
``Network``; each kernel names its recipe and recipe id), and a host process with the step spans and rows for
the user's Python with the bridge's dispatch, launches, compiles and syncs. Times are microseconds, with both
ends of a span on whole nanoseconds, so that spans on a row nest or are disjoint as Perfetto requires. Every span
whose time comes from the cost model or a bridge constant carries ``"estimate": true`` in its args; measured
time says so (``"measured"``). The writer puts one event per line inside the ``traceEvents`` array; the reader
accepts any trace-event JSON (an object with ``traceEvents``, or a bare array), whatever its line breaks, and
checks each event against the schema written here (``check_event``).

A trace is written as a cache file is: to a temporary file in the same folder, renamed over the path, so it
never goes through a link (symbolic or hard) planted at the path, never into a FIFO, and never half-written;
a path that is a link, a directory or not a regular file is refused before a run (``check_writable``). Reads
open regular files only (a FIFO would block forever).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from typing import IO, Iterator

from .model import DEVICE_ROWS, HOST_ROWS, Span
from ..errors import HpuBackendError

CHUNK = 1 << 20
MAX_EVENT_BYTES = 1 << 20  # one event larger than this is not a trace we read
HOST_PID, DEVICE_PID = 1, 2


class TraceError(HpuBackendError, ValueError):
    """A trace that cannot be written or read: one line naming the file and what is wrong."""


def device_process(rank: int) -> str:
    return f"/device:HPU:{rank}"


def write(path: str, spans: list[Span], rank: int = 0, other: dict | None = None) -> None:
    """Write ``spans`` to ``path`` (TraceError for a missing folder, a read-only place, or a path that is not a
    regular file)."""
    check_writable(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".trace-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
        with os.fdopen(fd, "w") as f:
            _write(f, spans, rank, other or {})
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a trace from the colleague it is meant for
        os.replace(tmp, path)  # replaces a link planted since the check; never writes through it
        tmp = None
    except OSError as e:
        raise TraceError(f"--trace {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            _remove(tmp)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # never created, or already gone
        pass


def rank_path(path: str, rank: int, world: int) -> str:
    """One file per rank: ``trace.json`` as is for one rank, ``trace-rank1.json`` for rank 1 of several."""
    if world <= 1:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-rank{rank}{ext}"


def check_writable(path: str) -> None:
    """Fail early, before a run, for a trace path that cannot be written: its folder missing or read-only, or the
    path a link, a directory, a FIFO or another file that is not a regular one."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TraceError(f"--trace {path}: no such directory {folder}")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise TraceError(f"--trace {path}: {_kind(mode)}, not a regular file (a trace is never written through a "
                         "link or into a FIFO: remove it or choose another path)")
    if not os.access(folder, os.W_OK) or (mode is not None and not os.access(path, os.W_OK)):
        raise TraceError(f"--trace {path}: not writable (read-only file system or no permission)")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "a special file"


def _write(f: IO[str], spans: list[Span], rank: int, other: dict) -> None:
    head = {"displayTimeUnit": "ms", "otherData": {"producer": "hpu_backend", "rank": rank, **other}}
    f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
    first = True
    for event in _metadata(rank) + [_event(s) for s in spans]:
        f.write(("" if first else ",\n") + json.dumps(event, default=str))
        first = False
    f.write("\n]}\n")


def _metadata(rank: int) -> list[dict]:
    rows = [(HOST_PID, f"/host:CPU (rank {rank})", HOST_ROWS), (DEVICE_PID, device_process(rank), DEVICE_ROWS)]
    out = []
    for pid, name, threads in rows:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for tid, row in enumerate(threads, 1):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def _event(s: Span) -> dict:
    pid, rows = (HOST_PID, HOST_ROWS) if s.process == "host" else (DEVICE_PID, DEVICE_ROWS)
    # Both ends rounded to whole nanoseconds and the duration taken between them: rounding the start and the
    # duration apart can push a span 1 ns past the start of the next one on its row, and Perfetto drops a span
    # that partly overlaps another on its row (complete events must nest or be disjoint).
    begin, end = _ns(s.start_s), _ns(s.start_s + s.dur_s)
    return {"ph": "X", "pid": pid, "tid": rows.index(s.row) + 1, "name": s.name, "cat": s.row,
            "ts": begin / 1000, "dur": (end - begin) / 1000, "args": s.args}


def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


# -- reading ------------------------------------------------------------------------------------------------


def events(path: str, chunk: int = CHUNK) -> Iterator[dict]:
    """The trace events of ``path``, one at a time, read ``chunk`` bytes at a time, each checked against the
    schema we write (TraceError: one line)."""
    f = _open_regular(path)
    with f:
        for event in _Stream(f, path, chunk).events():
            check_event(event, path)
            yield event


def _open_regular(path: str) -> IO[str]:
    """``path`` opened for reading if it is a regular file; a FIFO is refused without waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise TraceError(f"{path}: {_kind(mode)}, not a regular file (a trace is a file)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, encoding="utf-8", errors="replace")


_SCALAR_ID = (int, str)  # pid and tid: what the trace-event format allows (we write ints)


def check_event(e: dict, path: str) -> None:
    """One event against the schema ``write`` produces: ``ph`` a string; ``pid``/``tid`` a number or a string;
    ``ts``/``dur`` finite numbers (``dur`` not negative); ``name``/``cat`` strings; ``args`` an object."""
    ph = e.get("ph")
    if not isinstance(ph, str):
        raise TraceError(f"{path}: not a trace (an event's \"ph\" is {_what(ph)}, not a string)")
    for key in ("pid", "tid"):
        if key in e and (not isinstance(e[key], _SCALAR_ID) or isinstance(e[key], bool)):
            raise TraceError(f"{path}: not a trace (an event's \"{key}\" is {_what(e[key])}, not a number or a "
                             "string)")
    for key in ("ts", "dur"):
        if key in e and not _finite(e[key], minimum=0.0 if key == "dur" else -math.inf):
            raise TraceError(f"{path}: not a trace (an event's \"{key}\" is {_what(e[key])}, not a finite "
                             f"number{' >= 0' if key == 'dur' else ''})")
    for key, kind, name in (("name", str, "a string"), ("cat", str, "a string"), ("args", dict, "an object")):
        if key in e and not isinstance(e[key], kind):
            raise TraceError(f"{path}: not a trace (an event's \"{key}\" is {_what(e[key])}, not {name})")


def _finite(value, minimum: float = -math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= minimum


def _what(value) -> str:
    """A value as an error names it: short, whatever its size."""
    text = json.dumps(value, default=str) if not isinstance(value, (list, dict)) else type(value).__name__
    return {"list": "a list", "dict": "an object"}.get(text, text[:40])


class _Stream:
    """An incremental reader of the one array of trace events in a JSON document."""

    def __init__(self, f: IO[str], path: str, chunk: int):
        self.f, self.path, self.chunk = f, path, chunk
        self.buf, self.pos, self.eof = "", 0, False
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(self.chunk)
        self.eof = not data
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return bool(data)

    def _skip_space(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def events(self) -> Iterator[dict]:
        first = self._skip_space()
        if first not in ("{", "["):
            raise TraceError(f"{self.path}: not JSON (a trace is a JSON object or array)")
        if first == "{":
            self._find_array()
        self.pos += 1  # past "["
        while True:
            c = self._skip_space()
            if c == "]":
                return
            if c == ",":
                self.pos += 1
                continue
            if not c:
                raise TraceError(f"{self.path}: not JSON (the trace ends inside its event array)")
            yield self._value()

    def _find_array(self) -> None:
        """Move to the ``[`` of ``"traceEvents"`` (the keys before it are skipped a chunk at a time)."""
        key = '"traceEvents"'
        while True:
            at = self.buf.find(key, self.pos)
            if at >= 0:
                self.pos = at + len(key)
                break
            self.pos = max(len(self.buf) - len(key), self.pos)
            if not self._more():
                raise TraceError(f"{self.path}: {self._kind()}, but not a trace (no traceEvents array)"
                                 if self._kind() == "JSON" else f"{self.path}: not JSON")
        c = self._skip_space()
        if c == ":":
            self.pos += 1
            c = self._skip_space()
        if c != "[":
            raise TraceError(f"{self.path}: JSON, but not a trace (traceEvents is not an array)")

    def _kind(self) -> str:
        """"JSON" when the file parses as JSON (checked whole only when it is small), else "not JSON"."""
        try:
            if os.path.getsize(self.path) > MAX_EVENT_BYTES:
                return "JSON"  # a large file without the key: not a trace either way, never loaded whole
            with open(self.path, encoding="utf-8", errors="replace") as f:
                json.load(f)
        except (OSError, ValueError):
            return "not JSON"
        return "JSON"

    def _value(self) -> dict:
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise TraceError(f"{self.path}: not a trace (an event nested deeper than a trace event is)") from None
            except json.JSONDecodeError:
                if len(self.buf) - self.pos > MAX_EVENT_BYTES:
                    raise TraceError(f"{self.path}: not JSON, or an event over {MAX_EVENT_BYTES} bytes") from None
                if not self._more():
                    raise TraceError(f"{self.path}: not JSON (broken inside the event array)") from None
                continue
            if end == len(self.buf) and not self.eof:  # a number may go on in the next chunk
                self._more()
                continue
            self.pos = end
            if not isinstance(value, dict):
                raise TraceError(f"{self.path}: not a trace (an entry of traceEvents is not an object)")
            return value
