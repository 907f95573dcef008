"""The simulated device's memory counters (``hpu_backend.gaudi.memory_allocated`` and friends, Gaudi's
``habana_frameworks.torch.hpu`` names): what the recipes that ran hold, from their memory plans. One device
per process; every session observes its runs with ``on_run``.

The device holds every tensor a compiled graph read or produced (parameters, inputs, activations saved for
the backward, gradients) while it lives: a storage is counted once, from the first recipe call that reads or
writes it until it is freed. While a recipe runs it also holds its planned arena
(the intermediates, ``facts["memory"]["arena_bytes"]`` at its bucket), so the peak of a call is what was
resident, plus the arena, plus the outputs it writes. Eager ops outside compiled graphs (an uncompiled
optimizer step, for instance) are not on the simulated device and are not counted; neither are graphs
replayed by ``wrap_in_hpu_graph``/``mode="reduce-overhead"`` (they hold their static buffers).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

from ..targets import device

_lock = threading.RLock()  # a tensor freed by the collector inside _on_run releases under it
_storages: dict[int, tuple] = {}  # data pointer -> (bytes, weak reference), for every storage counted and not yet freed
_stats = {"InUse": 0, "MaxInUse": 0, "NumAllocs": 0, "NumFrees": 0, "MaxAllocSize": 0}
_target = ["gaudi2"]


def memory_allocated() -> int:
    """Bytes of simulated device memory held now by the tensors of what ran."""
    return _stats["InUse"]


def max_memory_allocated() -> int:
    """The largest ``memory_allocated()`` since start or ``reset_peak_memory_stats()``, arenas included."""
    return _stats["MaxInUse"]


def reset_peak_memory_stats() -> None:
    """Start the peak over from the memory held now."""
    with _lock:
        _stats["MaxInUse"] = _stats["InUse"]


def memory_stats() -> dict[str, Any]:
    """Gaudi's ``memory_stats()`` keys: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize."""
    with _lock:
        return {"Limit": int(device(_target[0]).hbm_bytes), **_stats, "ActiveAllocs": len(_storages)}


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
        _target[0] = recipe.target
        held = 0
        for values in (args, outs):
            for v in values:
                if isinstance(v, torch.Tensor) and not v.is_meta:
                    held += _add(v)
        _stats["InUse"] += held
        arena = _arena(recipe)
        if _stats["InUse"] + arena > _stats["MaxInUse"]:  # while it ran: all that, and its arena
            _stats["MaxInUse"] = _stats["InUse"] + arena


def _arena(recipe) -> int:
    return int(recipe.facts.get("memory", {}).get("arena_bytes", 0))
