"""The device's memory: what its tensors and the recipes that ran hold, against the target's HBM (Gaudi's
``memory_allocated`` and friends, ``torch.hpu``'s and ``hpu_backend.gaudi``'s names).

One ``Memory`` per device context (``context.py``). Its counters start with the ``hpu`` device, or else at their
first reading; from then on every run of every session is counted with ``on_run``, and until then a compiled
call pays nothing for them.

The device holds every tensor a compiled graph read or produced (parameters, inputs, activations saved for
the backward, gradients) while it lives: a storage is counted once, from the first recipe call that reads or
writes it until it is freed. While a recipe runs it also holds its planned arena (the intermediates,
``facts["memory"]["arena_bytes"]`` at its bucket), so the peak of a call is what was resident, plus the arena,
plus the outputs it writes. Graphs replayed by ``wrap_in_hpu_graph``/``mode="reduce-overhead"`` hold their
static buffers and are not counted again.

Every storage a device tensor gets is counted by ``allocate()`` (optimizer state, DDP buckets, tensors made
outside compiled graphs), against the target's HBM, and a request past it raises ``DeviceOutOfMemoryError``.
``HPU_BACKEND_HBM_BYTES`` (or ``set_capacity()``) sets a smaller capacity, for tests and for planning a
smaller card.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Any

import torch

from ..targets import device
from ..errors import HpuBackendError

CAPACITY_ENV = "HPU_BACKEND_HBM_BYTES"
LARGE = 1 << 26  # bytes: requests from this size up are checked before the host allocates them


class DeviceOutOfMemoryError(HpuBackendError, torch.OutOfMemoryError):
    """A device allocation past the HBM capacity (raised by ``allocate``): names the request, use and capacity."""


class Memory:
    """The device's allocations and the counters Gaudi reports on them."""

    def __init__(self):
        self.lock = threading.RLock()  # a tensor freed by the collector inside on_run releases under it
        self.storages: dict[int, tuple] = {}  # data pointer -> (bytes, weak reference), counted and not yet freed
        # storages handed to a library that resizes them (FSDP): storage handle -> (weak reference, data pointer
        # counted under); their bytes are counted again when they may have changed (reconcile)
        self.resizable: dict[int, tuple] = {}
        self.stats = {"InUse": 0, "MaxInUse": 0, "NumAllocs": 0, "NumFrees": 0, "MaxAllocSize": 0}
        # The target whose HBM the counters hold against: the enabled device's when there is one, else that of
        # the last recipe that ran. A run never overrides the device's: a graph compiled for another target in
        # the same process (a test, a planning call) must not change the device's capacity or its OOM message.
        self.device_target: str | None = None
        self.run_target = "gaudi2"
        self.limit: int | None = None  # set_capacity(); None: HPU_BACKEND_HBM_BYTES, else the target's HBM
        self.started = False  # counting the runs of compiled graphs (the context starts it)
        self.held_against: tuple[int, str] | None = None  # (capacity, target) the device's allocations check
        self.me = weakref.ref(self)  # what a counted storage's release names (weakly: see _add)

    def set_target(self, target: str) -> None:
        """The device whose HBM the counters are held against (``gaudi2`` | ``gaudi3``)."""
        device(target)  # KeyError for an unknown one
        self.device_target = target
        self.held_against = None

    def target(self) -> str:
        """The target the counters hold against: the device's, else the last recipe run's."""
        return self.device_target or self.run_target

    def set_capacity(self, nbytes: int | None) -> None:
        """Hold allocations against ``nbytes`` instead of the target's HBM (None: back to the default)."""
        self.limit = None if nbytes is None else int(nbytes)
        self.held_against = None

    def capacity(self) -> int:
        """The bytes the device may hold: ``set_capacity()``, else ``HPU_BACKEND_HBM_BYTES``, else the target's
        HBM."""
        if self.limit is not None:
            return self.limit
        text = os.environ.get(CAPACITY_ENV, "").strip()
        if text:
            return env_capacity(text)
        return int(device(self.target()).hbm_bytes)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as ``torch.cuda.mem_get_info``."""
        total = self.capacity()
        return max(total - self.allocated(), 0), total

    def check_request(self, nbytes: int) -> None:
        """Refuse a large device allocation of ``nbytes`` that cannot fit before the host is asked for the memory
        (a 1 TiB request is the device's out-of-memory error, not the host allocator's); a small one is checked
        by ``allocate`` once made, as every allocation is."""
        if nbytes < LARGE:
            return
        limit = self._limit()
        if self.stats["InUse"] + nbytes > limit:
            raise DeviceOutOfMemoryError(self._oom_text(nbytes, limit))

    def _oom_text(self, nbytes: int, limit: int) -> str:
        name = self.target()
        limited = ", limited by " + CAPACITY_ENV if limit != device(name).hbm_bytes else ""
        return (f"hpu out of memory: tried to allocate {_size(nbytes)}; {_size(self.stats['InUse'])} in use "
                f"of {_size(limit)} ({name} HBM{limited})")

    def _limit(self) -> int:
        """``capacity()`` for the device's allocations: read once per target and capacity set (the environment is
        read when the device starts, as Gaudi's bridge reads its variables), not on every allocation."""
        target = self.target()
        if self.held_against is None or self.held_against[1] != target:
            self.held_against = (self.capacity(), target)
        return self.held_against[0]

    def allocate(self, t: torch.Tensor) -> None:
        """Count a device tensor's storage (once, until it is freed); DeviceOutOfMemoryError past the capacity.
        (Every device op's result comes here: the common case, a storage already counted, returns first.)"""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.storages:
            return
        if self.resizable:  # a resized storage's new memory is that storage's, not another allocation
            self.reconcile(refuse=True)
            if ptr in self.storages:
                return
        nbytes = storage.nbytes()
        if not nbytes:
            return
        with self.lock:
            limit = self._limit()
            if self.stats["InUse"] + nbytes > limit:
                raise DeviceOutOfMemoryError(self._oom_text(nbytes, limit))
            self.stats["InUse"] += self._add(storage)
            if self.stats["InUse"] > self.stats["MaxInUse"]:
                self.stats["MaxInUse"] = self.stats["InUse"]

    def allocated(self) -> int:
        """Bytes of device memory held now."""
        if self.resizable:
            self.reconcile()
        return self.stats["InUse"]

    def max_allocated(self) -> int:
        """The largest ``allocated()`` since the start or ``reset_peak()``, arenas included."""
        return self.stats["MaxInUse"]

    def reset_peak(self) -> None:
        """Start the peak over from the memory held now."""
        with self.lock:
            self.stats["MaxInUse"] = self.stats["InUse"]

    def memory_stats(self) -> dict[str, Any]:
        """Gaudi's ``memory_stats()`` keys: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs,
        MaxAllocSize."""
        with self.lock:
            self.reconcile()
            return {"Limit": self.capacity(), **self.stats, "ActiveAllocs": len(self.storages)}

    def _add(self, storage: torch.UntypedStorage) -> int:
        """Count a storage (one Python object per storage, kept while the storage lives) if it is new to the device,
        until it is freed; the bytes newly held."""
        ptr = storage.data_ptr()
        if ptr in self.storages:
            return 0
        nbytes = storage.nbytes()
        # a weak reference to the storage, cheaper than a finalizer; it names this Memory weakly, so that a
        # context closed and dropped is not kept alive by the tensors it counted
        self.storages[ptr] = (nbytes, weakref.ref(storage, functools.partial(_freed, self.me, ptr)))
        self.stats["NumAllocs"] += 1
        if nbytes > self.stats["MaxAllocSize"]:
            self.stats["MaxAllocSize"] = nbytes
        return nbytes

    def watch_resizes(self, storage: torch.UntypedStorage) -> None:
        """Count ``storage`` by its size from now on, whatever a library resizes it to (FSDP frees an unsharded flat
        parameter by resizing its storage to nothing, and restores it by resizing it back)."""
        with self.lock:
            self.reconcile()
            if storage._cdata not in self.resizable:
                self.resizable[storage._cdata] = (weakref.ref(storage), storage.data_ptr())

    def reconcile(self, refuse: bool = False) -> None:
        """Bring the counts of the watched storages to their present sizes: a freed one releases its bytes, a
        restored one holds them again (past the capacity, with ``refuse``, as an allocation: the device's
        out-of-memory error; a reading of the counters only counts)."""
        with self.lock:
            for handle, (ref, counted_at) in list(self.resizable.items()):
                storage = ref()
                if storage is None:
                    del self.resizable[handle]
                    continue
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
                held = self.storages.get(counted_at, (0,))[0]
                if ptr == counted_at and held == nbytes:
                    continue
                self.release(counted_at)
                self.resizable[handle] = (ref, ptr)
                if nbytes:
                    if refuse and self.stats["InUse"] + nbytes > (limit := self._limit()):
                        raise DeviceOutOfMemoryError(self._oom_text(nbytes, limit))
                    self.stats["InUse"] += self._add(storage)
                    self.stats["MaxInUse"] = max(self.stats["MaxInUse"], self.stats["InUse"])

    def release(self, ptr: int) -> None:
        with self.lock:
            held = self.storages.pop(ptr, None)
            if held is not None:
                self.stats["InUse"] -= held[0]
                self.stats["NumFrees"] += 1

    def on_run(self, recipe, args: list, outputs) -> None:
        """Count what one run of a compiled graph held (nothing before the counters started)."""
        if recipe is None or not self.started:
            return
        outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        with self.lock:
            self.run_target = recipe.target
            held = 0
            for values in (args, outs):
                for v in values:
                    if isinstance(v, torch.Tensor) and v.device.type == "cpu":  # device tensors: counted when made
                        held += self._add(v.untyped_storage())
            self.stats["InUse"] += held
            arena = int(recipe.facts.get("memory", {}).get("arena_bytes", 0))
            if self.stats["InUse"] + arena > self.stats["MaxInUse"]:  # while it ran: all that, and its arena
                self.stats["MaxInUse"] = self.stats["InUse"] + arena


def _freed(memory: "weakref.ref[Memory]", ptr: int, _ref=None) -> None:
    owner = memory()
    if owner is not None:
        owner.release(ptr)


def env_capacity(text: str) -> int:
    """``HPU_BACKEND_HBM_BYTES`` with its units (``1GB``, ``16GiB``); a value that is not a size is an error
    naming it, never a silent fall back to the target's HBM."""
    from ..settings import SettingsError
    from ..units import SIZE_FORMS, parse_size

    nbytes = parse_size(text)
    if nbytes is None:
        raise SettingsError(f"environment variable {CAPACITY_ENV}={text!r} is not valid: use {SIZE_FORMS}")
    return nbytes


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"
