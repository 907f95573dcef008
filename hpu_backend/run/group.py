"""The processes a rank owns, tied to the launcher's life: each rank leads a process group of its own (the
helpers it forks join it), asks the kernel for SIGTERM when the launcher dies (``PR_SET_PDEATHSIG``), and the
group is stopped as one whatever ends the rank (its failure, the launcher's stop, the launcher's death).

Linux gives the parent-death signal and ``/proc`` (to see a group's members); elsewhere a rank still leads its
group and is stopped with it, but outlives a launcher killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PARENT_ENV = "HPU_BACKEND_RUN_PARENT"  # the launcher's pid, set in every rank: was it gone before we could ask?
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def follow_parent() -> bool:
    """In a rank, first thing: SIGTERM to us when the launcher dies. False when it has died already (between
    our fork and this call the kernel could not tell us)."""
    expected = os.environ.pop(PARENT_ENV, "")  # ours alone: a launcher the script starts is not a rank of ours
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: libc's prctl, no library search
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return not expected.isdigit() or os.getppid() == int(expected)


def members(pgid: int) -> list[int]:
    """The live (not zombie) processes of group ``pgid``; on a system without ``/proc``, ``[pgid]`` while the
    group has any process (zombies included)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _group_of(int(name)) == pgid:
            found.append(int(name))
    return found


def _group_of(pid: int) -> int | None:
    """The process group of a live process ``pid`` (None: gone, a zombie, or not readable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
    if len(fields) < 3 or fields[0] in ("Z", "X"):
        return None
    return int(fields[2])


def stop(pgid: int, grace: float, first: int = signal.SIGTERM) -> None:
    """Stop every process of group ``pgid``: ``first``, then SIGKILL to what is left after ``grace`` seconds."""
    if not _signal_group(pgid, first):
        return
    end = time.monotonic() + grace
    while members(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    if members(pgid):
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone: nothing of it runs
        return False
    return True


def stop_helpers(grace: float) -> None:
    """In a rank leading its group, at its end: stop the processes it forked and left behind (when the
    launcher is alive it does this too; when it was killed, only the rank can)."""
    me = os.getpid()
    if os.getpgrp() != me:  # not a rank we started: the group is the user's shell job, not ours
        return
    helpers = [p for p in members(me) if p != me]
    for pid in helpers:
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(_group_of(p) == me for p in helpers):
        time.sleep(0.05)
    for pid in helpers:
        if _group_of(pid) == me:
            _signal(pid, signal.SIGKILL)


def children() -> set[int]:
    """The live processes this one started and those they started (empty without ``/proc``)."""
    if not os.path.isdir("/proc/self"):
        return set()
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent_of(int(name))
            if parent is not None:
                parents.setdefault(parent, []).append(int(name))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:  # ended while we looked
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[0] not in ("Z", "X") else None


def stop_new_children(before: set[int], grace: float) -> None:
    """Stop the processes started since ``children()`` returned ``before`` (a failed script's helpers, when
    it ran in this process), SIGTERM then SIGKILL after ``grace`` seconds."""
    started = children() - before
    for pid in started:
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and started & children():
        time.sleep(0.05)
    for pid in started & children():
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended between the scan and the signal
        pass
