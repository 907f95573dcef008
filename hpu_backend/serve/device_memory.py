"""The simulated device's memory counters (``hpu_backend.gaudi.memory_allocated`` and friends, Gaudi's
``habana_frameworks.torch.hpu`` names): what the recipes that ran hold, from their memory plans. One device
per process. The counters start with the ``hpu`` device, or else at their first call (a reading or a reset);
from then on every run of every session is observed with ``on_run``, and until then a compiled call pays nothing
for them.

The device holds every tensor a compiled graph read or produced (parameters, inputs, activations saved for
the backward, gradients) while it lives: a storage is counted once, from the first recipe call that reads or
writes it until it is freed. While a recipe runs it also holds its planned arena
(the intermediates, ``facts["memory"]["arena_bytes"]`` at its bucket), so the peak of a call is what was
resident, plus the arena, plus the outputs it writes. Eager ops outside compiled graphs (an uncompiled
optimizer step, for instance) are not on the simulated device and are not counted; neither are graphs
replayed by ``wrap_in_hpu_graph``/``mode="reduce-overhead"`` (they hold their static buffers).

The ``hpu`` device (``hpu_backend.device``) allocates through ``allocate()``: every storage a device tensor
gets is counted here too (optimizer state, DDP buckets, tensors made outside compiled graphs), against the
target's HBM, and a request past it raises ``DeviceOutOfMemoryError``. ``HPU_BACKEND_HBM_BYTES`` (or
``set_capacity()``) sets a smaller capacity, for tests and for planning a smaller card.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Any

import torch

from ..targets import device
from .session import observe_every_run
from ..errors import HpuBackendError

_lock = threading.RLock()  # a tensor freed by the collector inside _on_run releases under it
_storages: dict[int, tuple] = {}  # data pointer -> (bytes, weak reference), for every storage counted and not yet freed
_stats = {"InUse": 0, "MaxInUse": 0, "NumAllocs": 0, "NumFrees": 0, "MaxAllocSize": 0}
# The target whose HBM the counters hold against: the enabled hpu device's (set_target) when there is one, else
# that of the last recipe that ran. A run never overrides the device's: a graph compiled for another target in
# the same process (a test, a planning call) must not change the device's capacity or its OOM message.
_target = {"device": None, "run": "gaudi2"}
_capacity: list[int | None] = [None]  # set_capacity(); None: HPU_BACKEND_HBM_BYTES, else the target's HBM
_started = [False]
CAPACITY_ENV = "HPU_BACKEND_HBM_BYTES"
_LARGE = 1 << 26  # bytes: requests from this size up are checked before the host allocates them


class DeviceOutOfMemoryError(HpuBackendError, torch.OutOfMemoryError):
    """A device allocation past the HBM capacity (raised by ``allocate``): names the request, use and capacity."""


def start() -> None:
    """Count from now on: observe every run of every session (once per process; the device and every reading
    call it)."""
    if _started[0]:
        return
    with _lock:
        if not _started[0]:
            observe_every_run(on_run)
            _started[0] = True


def set_target(target: str) -> None:
    """The device whose HBM the counters are held against (``gaudi2`` | ``gaudi3``)."""
    device(target)  # KeyError for an unknown one
    _target["device"] = target


def target() -> str:
    """The target the counters hold against: the device's, else the last recipe run's."""
    return _target["device"] or _target["run"]


def set_capacity(nbytes: int | None) -> None:
    """Hold allocations against ``nbytes`` instead of the target's HBM (None: back to the default)."""
    _capacity[0] = None if nbytes is None else int(nbytes)


def capacity() -> int:
    """The bytes the device may hold: ``set_capacity()``, else ``HPU_BACKEND_HBM_BYTES``, else the target's HBM."""
    if _capacity[0] is not None:
        return _capacity[0]
    text = os.environ.get(CAPACITY_ENV, "").strip()
    if text:
        return _env_capacity(text)
    return int(device(target()).hbm_bytes)


def _env_capacity(text: str) -> int:
    """``HPU_BACKEND_HBM_BYTES`` with its units (``1GB``, ``16GiB``); a value that is not a size is an error
    naming it, never a silent fall back to the target's HBM."""
    from ..settings import SettingsError
    from ..units import SIZE_FORMS, parse_size

    nbytes = parse_size(text)
    if nbytes is None:
        raise SettingsError(f"environment variable {CAPACITY_ENV}={text!r} is not valid: use {SIZE_FORMS}")
    return nbytes


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of device memory, as ``torch.cuda.mem_get_info``."""
    start()
    total = capacity()
    return max(total - _stats["InUse"], 0), total


def check_request(nbytes: int) -> None:
    """Refuse a large device allocation of ``nbytes`` that cannot fit before the host is asked for the memory (a
    1 TiB request is the device's out-of-memory error, not the host allocator's); a small one is checked by
    ``allocate`` once made, as every allocation is."""
    if nbytes < _LARGE:
        return
    limit = capacity()
    if _stats["InUse"] + nbytes > limit:
        raise DeviceOutOfMemoryError(_oom_text(nbytes, limit))


def _oom_text(nbytes: int, limit: int) -> str:
    name = target()
    limited = ", limited by " + CAPACITY_ENV if limit != device(name).hbm_bytes else ""
    return (f"hpu out of memory: tried to allocate {_size(nbytes)}; {_size(_stats['InUse'])} in use "
            f"of {_size(limit)} ({name} HBM{limited})")


def allocate(t: torch.Tensor) -> None:
    """Count a device tensor's storage (once, until it is freed); DeviceOutOfMemoryError past the capacity."""
    storage = t.untyped_storage()
    if storage.data_ptr() in _storages or not storage.nbytes():
        return
    with _lock:
        limit = capacity()
        if _stats["InUse"] + storage.nbytes() > limit:
            raise DeviceOutOfMemoryError(_oom_text(storage.nbytes(), limit))
        _stats["InUse"] += _add(t)
        _stats["MaxInUse"] = max(_stats["MaxInUse"], _stats["InUse"])


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"


def memory_allocated() -> int:
    """Bytes of simulated device memory held now by the tensors of what ran."""
    start()
    return _stats["InUse"]


def max_memory_allocated() -> int:
    """The largest ``memory_allocated()`` since start or ``reset_peak_memory_stats()``, arenas included."""
    start()
    return _stats["MaxInUse"]


def reset_peak_memory_stats() -> None:
    """Start the peak over from the memory held now."""
    start()
    with _lock:
        _stats["MaxInUse"] = _stats["InUse"]


def memory_stats() -> dict[str, Any]:
    """Gaudi's ``memory_stats()`` keys: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize."""
    start()
    with _lock:
        return {"Limit": capacity(), **_stats, "ActiveAllocs": len(_storages)}


def _add(t: torch.Tensor) -> int:
    """Count ``t``'s storage if it is new to the device (until that storage is freed); the bytes newly held."""
    storage = t.untyped_storage()  # one Python object per storage, kept while the storage lives
    ptr = storage.data_ptr()
    if ptr in _storages:
        return 0
    nbytes = storage.nbytes()
    _storages[ptr] = (nbytes, weakref.ref(storage, functools.partial(_release, ptr)))  # a ref: cheaper than finalize
    _stats["NumAllocs"] += 1
    if nbytes > _stats["MaxAllocSize"]:
        _stats["MaxAllocSize"] = nbytes
    return nbytes


def _release(ptr: int, _ref=None) -> None:
    with _lock:
        held = _storages.pop(ptr, None)
        if held is not None:
            _stats["InUse"] -= held[0]
            _stats["NumFrees"] += 1


def on_run(recipe, args: list, outputs) -> None:
    """Count what one run of a compiled graph held (a run observer of every session)."""
    if recipe is None:
        return
    outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    with _lock:
        _target["run"] = recipe.target
        held = 0
        for values in (args, outs):
            for v in values:
                if isinstance(v, torch.Tensor) and v.device.type == "cpu":  # device tensors: counted when made
                    held += _add(v)
        _stats["InUse"] += held
        arena = _arena(recipe)
        if _stats["InUse"] + arena > _stats["MaxInUse"]:  # while it ran: all that, and its arena
            _stats["MaxInUse"] = _stats["InUse"] + arena


def _arena(recipe) -> int:
    return int(recipe.facts.get("memory", {}).get("arena_bytes", 0))
