"""The background writer: one daemon thread that runs disk jobs in order so callers never wait on the disk."""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref

logger = logging.getLogger("recipecache")
_WRITERS: "weakref.WeakSet[BackgroundWriter]" = weakref.WeakSet()
# An idle thread exits (and keeps nothing alive); the next submit starts a new one.
_IDLE_EXIT_S = 2.0


class BackgroundWriter:
    """Runs submitted callables on a lazily started thread; on_idle runs whenever the queue drains."""

    def __init__(self, name: str, on_idle=None):
        self.name = name
        self.on_idle = on_idle
        self._reset()
        _WRITERS.add(self)

    def _reset(self) -> None:
        self._start_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, job) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put(job)

    def drain(self) -> None:
        """Wait until every job submitted so far has run."""
        self._queue.join()

    def _run(self) -> None:
        q = self._queue
        while True:
            try:
                job = q.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                if self._exit_if_idle():
                    return
                continue
            try:
                self._call(job)
                if q.qsize() == 0 and self.on_idle is not None:
                    self._call(self.on_idle)
            finally:
                q.task_done()

    def _exit_if_idle(self) -> bool:
        with self._start_lock:  # submit() holds it too, so no job can slip in unseen
            if self._queue.empty():
                self._thread = None
                return True
            return False

    def _call(self, job) -> None:
        # The thread must survive a bug in one job, or flush() would wait forever; the bug is still logged.
        try:
            job()
        except Exception:
            logger.exception("recipe cache background job failed")


def _reset_after_fork() -> None:
    # A forked child inherits the queue but not the thread; start clean (the parent still owns its jobs).
    for writer in list(_WRITERS):
        writer._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
