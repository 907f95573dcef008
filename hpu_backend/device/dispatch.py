"""What the hpu device does with each aten op on its tensors: eager or lazy execution, placement, host reads.

``Device.__call__`` receives every op ``HpuTensor.__torch_dispatch__`` sees, with the host tensors in place
of the device ones:

- a **host read** (``_local_scalar_dense`` behind ``item()``/``bool()``/``int()``, ``_to_copy`` or ``copy_`` to
  the CPU behind ``.cpu()``, printing, ``torch.save``) is a sync: in lazy mode it first runs the pending graph
  when the read needs it, and it is reported with the user's source line;
- in **lazy mode** the op goes to the lazy recorder (``capture/lazy.py``, the one ``gaudi.lazy()`` uses):
  recorded into the pending graph, which ``mark_step()`` or a host read cuts, lowers and runs as a recipe;
- in **eager mode** the op is placed by the op table (``lowering/optable.py``): an op the device does not
  support for its dtypes falls back to the CPU with the bridge's log line (``serve/fallback.py``), or raises
  ``DeviceFallbackError`` in strict mode; an op the device runs is lowered the first time its layout comes, as
  a one-op graph of the same recorder cut at once (placed, planned, estimated, its recipe stored in the cache),
  and runs directly on the host tensors after that, adding its recipe's estimated device time to the step.

Results are wrapped back into device tensors (an in-place op returns the very tensor it wrote); each new
storage is counted by the device context's memory (``memory.py``). The ``Device`` is the context's
(``context.py``): it writes what it runs into the context's step ledger.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import Counter

import torch
import torch.utils._pytree as pytree

from ..capture.args import flatten, unflatten
from ..capture.lazy import LazyRecorder, user_line
from ..lowering import optable
from ..lowering.passes.place import SCALAR_TYPE
from ..serve import fallback
from ..settings import Settings
from ..timeline.record import Recorder
from .cards import resolve
from .context import current_context
from . import swap
from .lazy import Ledger
from .tensor import HPU, HpuTensor
from ..errors import HpuBackendError

aten = torch.ops.aten
CPU = torch.device("cpu")
KEPT_SYNCS = 10_000


class DeviceFallbackError(HpuBackendError, RuntimeError):
    """An op the device does not support for its dtypes, in strict mode (eager mode; lazy graphs raise
    ``LoweringError`` from placement)."""


class Device:
    """The hpu device of a context: its mode, settings, placement decisions and what it saw."""

    def __init__(self, mode: str, settings: Settings, release: str, recorder: LazyRecorder, ledger: Ledger):
        self.mode = mode
        self.release = release
        self.settings = settings
        self.table = optable.shared_table()
        self.placed: dict = {}  # (op, dtypes) -> None (on the device) or the fallback's log line
        self.fallbacks: Counter = Counter()  # (op, dtypes) -> executions on the CPU
        self.syncs: list[tuple[str, str, bool]] = []  # (what, source line, cut a graph)
        self.ops = 0
        # Eager mode lowers each op once per layout through the lazy recorder (a one-op graph, cut at once): its
        # recipe is placed, planned, estimated and stored like any other; repeats run the op at once and add
        # the estimate remembered for it.
        self.recorder = recorder  # the context's lazy recorder
        self.ledger = ledger  # the context's steps: ops, estimated device time, graphs, syncs
        self.lazy = mode == "lazy"
        self.estimates: dict = {}  # eager op and layout -> the estimated device seconds of its recipe
        self.op_names: dict[int, str] = {}  # id of an op in ``estimates`` -> its name
        self.timeline = Recorder(mode)  # the run's events for its step timeline (hpu_backend/timeline/)
        self.capture = None  # the HPU-graph capture under way (graphs.py): it is the recorder until it ends
        self.lock = threading.RLock()

    def __call__(self, func, args, kwargs):
        special = _special(func)
        if special & _COMPOSITE:  # only with autograd off (inference mode): torch's own decomposition, as autograd
            out = func.decompose(*args, **kwargs)  # would run it (``.cpu()`` is ``to``: a host read, then)
            if out is not NotImplemented:
                return out
        with self.lock:  # one op at a time: the recorder and the ledger are the device's, whatever thread calls
            self.timeline.enter()  # the user's Python stops here; the simulator's own time is not the host's
            try:
                if not self.lazy and not special:
                    out = self._again(func, args, kwargs)
                    if out is not _GENERAL:
                        return out
                return self._call(func, args, kwargs)
            finally:
                self.timeline.leave()

    def launch_kind(self) -> str:
        """How a recipe run now was launched: by this device's op or step end (its mode), else a compiled graph."""
        return ("lazy" if self.lazy else "eager") if self.timeline.depth else "compiled"

    def _call(self, func, args, kwargs):
        flat, spec = flatten(args, kwargs)
        wrappers, device, real = {}, None, True
        hosts = []
        special = _special(func)
        for a in flat:
            if isinstance(a, HpuTensor):
                wrappers[id(a.host)] = a
                if device is None:
                    device = a.device
                elif a.device != device and not special & _CROSS_DEVICE:
                    raise _mixed(device, a.device)
                real = real and type(a.host) is torch.Tensor
                a = a.host
            elif type(a) is torch.device and a.type == HPU:
                a = CPU  # the device's memory is the host's
            hosts.append(a)
        if special & _COLLECTIVE and func is _GATHER_INTO_TENSOR:
            _stack_gathered(hosts, wrappers)
        if special & _MUTABLE and type(flat[0]) is torch.Tensor and not special & _CROSS_DEVICE:
            # a host tensor written in place from a device one, without a copy (c.add_(t)): a real device refuses
            raise _mixed(flat[0].device, device)
        if special & _TO_COPY and isinstance(kwargs.get("device"), torch.device) and kwargs["device"].type == HPU:
            device = resolve(kwargs["device"])
        args, kwargs = unflatten(hosts, spec)
        if not real:  # traced (fake or functional hosts): no bookkeeping, the graph is what matters
            return self._traced(func, special, args, kwargs, hosts, wrappers, device)
        if special & _HANDLED:
            if special & _NO_OP:
                return None
            if special & _RESHAPES_SELF and isinstance(flat[0], HpuTensor):
                return self._reshape_in_place(func, args, kwargs, flat[0])
            read = _host_read(func, flat)
            if read:
                self.sync(read, [a for a in hosts if isinstance(a, torch.Tensor)])
                return func(*args, **kwargs)  # a host value or tensor: not wrapped
            if special & _COLLECTIVE:  # on the timeline's network row, then run; later work sees its result
                self._collective(func, hosts)
                self.ops += 1
                self.timeline.op()
                return _wrap(_completed(self.recorder.dispatch(func, args, kwargs)), wrappers, device)
            if _upload(func, flat):
                self.ops += 1
                self._copy_in(flat)
                self.sync_write(args[0])  # a host-to-device copy runs now: the host tensor is not held by a graph
                return _wrap(func(*args, **kwargs), wrappers, device)
        self.ops += 1
        self.timeline.op()
        if self.lazy:
            if _is_view(func):
                for host in wrappers:
                    self.recorder.track(wrappers[host].host)
            return _wrap(self.recorder.dispatch(func, args, kwargs), wrappers, device)
        key = _eager_key(func, args, kwargs)
        known = self.estimates.get(key) if key is not None else None
        if known is not None:  # an op and layout seen before, on the device: its estimate, and run at once
            return self._run_known(func, args, kwargs, known, wrappers, device)
        if self.place(func, hosts):
            return _wrap(func(*args, **kwargs), wrappers, device)  # on the CPU: no device recipe
        return _wrap(self._eager(func, args, kwargs, key), wrappers, device)

    def _again(self, func, args: tuple, kwargs: dict):
        """Eager mode's common case, most of its ops: an op the device ran before on these layouts, its
        arguments device tensors of one card and plain values (no tensor in a list, no device named). Run at
        once on the host tensors with the estimate remembered for it, as ``_call``'s shortcut does, without its
        general handling of arguments; ``_GENERAL`` when the op needs that (nothing done then)."""
        hosts, wrappers, device = [], {}, None
        for a in args:
            kind = type(a)
            if kind is HpuTensor:
                host = a.host
                if type(host) is not torch.Tensor or (device is not None and a.device != device):
                    return _GENERAL  # traced, or a mix of cards (the general path says so)
                device = device or a.device
                wrappers[id(host)] = a
                hosts.append(host)
            elif kind is list or kind is tuple:
                if any(isinstance(x, torch.Tensor) or type(x) is torch.device for x in a):
                    return _GENERAL
                hosts.append(a)
            elif kind is torch.device or isinstance(a, torch.Tensor):
                return _GENERAL
            else:
                hosts.append(a)
        if device is None or any(isinstance(v, (torch.Tensor, list, tuple, torch.device)) for v in kwargs.values()):
            return _GENERAL
        key = _eager_key(func, args, kwargs)
        known = self.estimates.get(key) if key is not None else None
        if known is None:
            return _GENERAL
        self.ops += 1
        self.timeline.op()
        return self._run_known(func, hosts, kwargs, known, wrappers, device)

    def _reshape_in_place(self, func, args: tuple, kwargs: dict, target: HpuTensor) -> HpuTensor:
        """An op that changes a tensor's shape, strides or memory in place (``squeeze_``, ``t_``, ``as_strided_``,
        ``resize_``, ``set_``, as FSDP frees and restores a flat parameter): it runs on the host tensor, pending
        work done first (it changes what the pending graph would write), and the device tensor takes the host
        tensor's new metadata, as a backend's own tensor would have changed."""
        self.flush(f"Tensor.{func._schema.name.split('::')[-1]}")
        self.ops += 1
        self.timeline.op()
        func(*args, **kwargs)
        swap.set_data(target, HpuTensor(target.host, target.device))
        return target

    def storage(self, t: HpuTensor) -> torch.UntypedStorage:
        """``t``'s storage, which is its host tensor's, pending work done first: a library may read or resize it
        directly (FSDP frees and restores a flat parameter's memory that way), which the pending graph must not
        see half done."""
        self.flush("Tensor.untyped_storage")
        return t.host.untyped_storage()

    def _run_known(self, func, args, kwargs: dict, known: tuple, wrappers: dict, device):
        """An eager op whose layout the device ran before: the estimate remembered for it, and run at once on the
        host tensors ``args``."""
        self.ledger.add_device_time(known[0])
        if known[1] is not None:
            self.timeline.again(known[1])
        return _wrap(func(*args, **kwargs), wrappers, device)

    def _traced(self, func, special: int, args: tuple, kwargs: dict, hosts: list, wrappers: dict, device):
        """An op of a graph being traced (Dynamo's fake tensors, AOTAutograd's functional ones). A tensor the graph
        made on the device itself comes to the host as a copy (``_host_side``): an op that writes it writes the
        copy, so the copy is written back into it, as the graph's own write (``zeros(..., device=x.device)`` then
        ``masked_fill_`` with a device mask: the mask must reach the tensor the graph goes on reading)."""
        fake = _fake_mode(hosts)
        moved = []  # (device-made tensor, its host copy)

        def host_side(t):
            h = _host_side(t, fake)
            if h is not t and t.device.type == HPU:
                moved.append((t, h))
            return h

        args, kwargs = pytree.tree_map_only(torch.Tensor, host_side, (args, kwargs))
        out = func(*args, **kwargs)
        if moved and special & _MUTABLE:
            written = _written(func, args, kwargs)
            for t, h in moved:
                if any(h is w for w in written):
                    t.copy_(h)
                    if out is h:
                        return t
        return _wrap(out, wrappers, device)

    def _eager(self, func, args, kwargs, key):
        """Run one op in eager mode the first time for its layout, as a one-op recipe (later calls of the layout
        take ``_call``'s shortcut)."""
        before = self.ledger.total_s
        self.timeline.last = None
        out = self.recorder.dispatch(func, args, kwargs)
        self.flush("eager op")
        if key is not None and len(self.estimates) < _EAGER_KEYS:
            self.estimates[key] = (self.ledger.total_s - before, self.timeline.last)
            self.op_names[key[0]] = str(func)  # keys hold the op's id (a cheap hash): its name, for the report
        return out

    def _collective(self, func, hosts: list) -> None:
        """A collective on device tensors, on the step timeline's network row (DDP's bucket all-reduces)."""
        import torch.distributed as dist

        nbytes = sum(a.numel() * a.element_size() for a in hosts if isinstance(a, torch.Tensor))
        group = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        kind = func._schema.name.removeprefix("c10d::").rstrip("_")
        self.timeline.comm({"allreduce": "all_reduce", "allgather": "all_gather",
                            "reduce_scatter": "reduce_scatter"}.get(kind, kind), nbytes, group)

    # -- host reads -----------------------------------------------------------------------------------------

    def sync(self, what: str, tensors: list) -> None:
        """A host read: run the pending lazy graph if it holds what is read; remember the user's line."""
        source = user_line()
        if self.capture is not None:
            self.capture.refuse(what, source, "the host reads a device value")
        cut = False
        r = self.recorder
        if self.lazy:
            cut = r.pending() and any(r._touched(t) for t in tensors)
            if cut:
                r.flush(what, source)
            r.on_sync(what, source, cut)
        if len(self.syncs) < KEPT_SYNCS:
            self.syncs.append((what, source, cut))
        self.timeline.sync(what, source)

    def _copy_in(self, flat: list) -> None:
        """A host→device copy on the timeline: its bytes, pinned or pageable source, blocking or not."""
        src = flat[1]
        non_blocking = len(flat) > 2 and flat[2] is True
        self.timeline.copy(src.numel() * src.element_size(), True, is_pinned(src), non_blocking, user_line(),
                           data_loader_in_use)

    def sync_write(self, host: torch.Tensor) -> None:
        """Before the host writes ``host`` directly: run the pending graph if it reads or writes it."""
        r = self.recorder
        if r.pending() and r._touched(host):
            r.flush("copy from host", user_line())

    def before_compiled(self) -> None:
        """A compiled graph is about to read device tensors: the simulator's time starts (it ends at the graph's
        launch), and the pending lazy graph runs first."""
        self.timeline.pause()
        self.flush("a compiled graph reads device tensors")

    def flush(self, reason: str) -> None:
        """Run the pending lazy graph, whatever it holds (before a compiled graph reads device tensors, an eager op's
        own one-op graph, before an op or a library changes a tensor's memory in place)."""
        if self.recorder.pending():
            self.recorder.flush(reason, user_line())

    # -- placement (eager mode) ---------------------------------------------------------------------------------

    def place(self, func, hosts: list) -> bool:
        """True when the op falls back to the CPU (logged and counted; DeviceFallbackError in strict mode)."""
        # keyed by the op and its tensors' dtypes as they come (names, sorted, only for a new key): every op asks
        key = (id(func), *[a.dtype for a in hosts if isinstance(a, torch.Tensor)])  # ops are never freed
        line = self.placed.get(key, 0)
        if line == 0:
            line = self.placed[key] = self._decide(func, _dtype_names(key[1:]))
        if line is not None:
            self._fall_back(func, _dtype_names(key[1:]), line)
        return line is not None

    def _decide(self, func, dtypes: tuple) -> str | None:
        """None when the device runs the op on these dtypes, else the bridge's fallback line for it."""
        name = func._schema.name if isinstance(func, torch._ops.OpOverload) else str(func)
        if not name.startswith("aten::") or optable.is_host_op(name):
            return None
        packet = optable.packet_name(name)
        record = self.table.lookup(packet) or (self.table.lookup(packet[:-1]) if packet.endswith("_") else None)
        on_cpu = self.settings.place_on_cpu and {packet, name} & self.settings.place_on_cpu
        if record is not None and record.capable(dtypes) and not on_cpu:
            return None
        return f"CPU fallback {packet} : " + " ".join(
            f"{a.name}=HPU{SCALAR_TYPE.get(d, d)}Type" for a, d in zip(func._schema.arguments, dtypes))

    def _fall_back(self, func, dtypes: tuple, line: str) -> None:
        name = optable.qualified_name(func._schema.name)
        if self.settings.strict:
            raise DeviceFallbackError(f"{name} ({', '.join(dtypes) or 'no tensors'}) is not supported on the hpu "
                                      "device and strict mode forbids a CPU fallback")
        first = not self.fallbacks[(name, dtypes)]
        self.fallbacks[(name, dtypes)] += 1
        fallback.executed((name,))
        if first and fallback.enabled():
            fallback.emit(line)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """Remember ``t`` as page-locked host memory (``pin_memory()`` made it), for as long as it lives."""
    current_context().pinned[t.untyped_storage().data_ptr()] = t
    return t


def is_pinned(t: torch.Tensor) -> bool:
    found = current_context().pinned.get(t.untyped_storage().data_ptr()) if t.numel() else None
    return found is not None


def _dtype_names(dtypes) -> tuple[str, ...]:
    """Dtypes as the op table and the fallback report name them: ("bfloat16", "float32"), each once, sorted."""
    return tuple(sorted({str(d).removeprefix("torch.") for d in dtypes}))


def _host_read(func, flat: list) -> str:
    """What an op reads onto the host ("" for an op that stays on the device)."""
    if func is aten._local_scalar_dense.default:
        return "Tensor.item"
    if func is aten._to_copy.default:
        device = next((a for a in flat if isinstance(a, torch.device)), None)
        return "Tensor.cpu" if device is not None and device.type == "cpu" else ""
    if func is aten.copy_.default and not isinstance(flat[0], HpuTensor):
        return "copy to host"
    return ""


_EAGER_KEYS = 100_000  # eager op layouts remembered (past it, new layouts lower each time they come)


def _eager_key(func, args, kwargs: dict):
    """The op and what its estimate depends on: each tensor's shape, strides and dtype, and every other value
    but floats (None when a value has no stable hash); lists by their items. A float (an optimizer's step size
    and bias corrections, new every step) changes what an eager op computes, not what it costs: on Gaudi an
    eager op is no graph, and a new float value compiles nothing."""
    parts = [id(func), tuple(kwargs)]
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            parts.append((a.shape, a.stride(), a.dtype))
        elif type(a) is float:
            parts.append(float)
        elif a is None or isinstance(a, _PLAIN):
            parts.append(a)
        elif type(a) is list or type(a) is tuple:
            items = _eager_key(None, a, {})
            if items is None:
                return None
            parts.append((type(a), *items[2:]))
        else:
            return None
    return tuple(parts)


_PLAIN = (bool, int, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_GENERAL = object()  # what ``Device._again`` returns for an op that needs the general path


@functools.cache
def _is_view(func) -> bool:
    """An op that returns a view of its input (not one that writes it)."""
    schema = func._schema
    return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


def _written(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an op writes, by its schema."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            out.extend(value if isinstance(value, (list, tuple)) else [value])
    return [t for t in out if isinstance(t, torch.Tensor)]


def _upload(func, flat: list) -> bool:
    """A copy from a host tensor into a device tensor (``tensor.to("hpu")``, ``dst.copy_(cpu_tensor)``)."""
    return func is aten.copy_.default and isinstance(flat[0], HpuTensor) and len(flat) > 1 \
        and isinstance(flat[1], torch.Tensor) and not isinstance(flat[1], HpuTensor)


def _fake_mode(hosts: list):
    """The fake mode of Dynamo's shape propagation when it is what runs this op (its hosts are fake tensors
    themselves, not AOTAutograd's functional wrappers), else None."""
    from torch._subclasses.fake_tensor import FakeTensor

    return next((h.fake_mode for h in hosts if isinstance(h, FakeTensor)), None)


def _host_side(t: torch.Tensor, fake) -> torch.Tensor:
    """A traced op's tensor as the host runs it. Under Dynamo's shape propagation (``fake``): a tensor a compiled
    graph made on the device itself (``arange(n, device=x.device)``, a plain fake tensor on hpu) becomes a host
    twin of its layout, and a literal the graph holds (``torch.tensor([], device=x.device)``, real values)
    becomes a fake one. Under AOTAutograd's trace, a device-made tensor is copied to the host in the graph (a
    copy the executor's ``host_device`` makes a no-op) and literals stay the graph's constants."""
    if fake is not None:
        if type(t) is torch.Tensor:
            return fake.from_tensor(t)
        if t.device.type == HPU and not isinstance(t, HpuTensor):
            with fake:
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=CPU)
        return t
    if type(t) is torch.Tensor:  # a literal under AOTAutograd's trace: lifted into the graph as torch lifts one
        return torch.ops.aten.lift_fresh_copy(t)
    return t.to(CPU) if t.device.type == HPU and not isinstance(t, HpuTensor) else t


# What makes an op more than a computation on the device, as bits (``_special``; most ops have none).
_CROSS_DEVICE = 1  # its tensors may lie on different devices: copies between them
_MUTABLE = 2  # writes an argument (a host tensor must not be written from a device one)
_TO_COPY = 4  # ``_to_copy``: its ``device`` argument names the card of the result
_NO_OP = 8  # nothing to do on this device: memory is freed with the host tensor, no stream holds it
_COLLECTIVE = 16  # a c10d op (DDP's bucket all-reduces): on the timeline's network row
_HOST_READ = 32  # may read a value onto the host, or copy one in
_COMPOSITE = 64  # torch decomposes it above autograd: it reaches the device only where autograd is off
_RESHAPES_SELF = 128  # changes its first argument's shape, strides or memory in place (squeeze_, set_, resize_)
_HANDLED = _NO_OP | _COLLECTIVE | _HOST_READ | _RESHAPES_SELF  # handled before the op runs as any other
_RESHAPING_OPS = (aten.set_.source_Tensor, aten.set_.source_Storage, aten.set_.source_Storage_storage_offset,
                  aten.set_.default, aten.resize_.default, aten.resize_as_.default)
_CROSS_DEVICE_OPS = (aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
                     aten._copy_from_and_resize.default, aten.set_.source_Tensor, aten.set_.source_Storage,
                     aten.set_.source_Storage_storage_offset)


@functools.cache  # ops are never freed, and an op's hash is its identity
def _special(func) -> int:
    """The op's bits above, asked once per op (the checks they stand for were most of the device's own cost)."""
    bits = _CROSS_DEVICE * (func in _CROSS_DEVICE_OPS) | _MUTABLE * func._schema.is_mutable
    bits |= _TO_COPY * (func is aten._to_copy.default) | _NO_OP * (func is aten.record_stream.default)
    bits |= _COLLECTIVE * (func.namespace == "c10d")
    bits |= _HOST_READ * (func in (aten._local_scalar_dense.default, aten._to_copy.default, aten.copy_.default))
    bits |= _RESHAPES_SELF * (torch.Tag.inplace_view in func.tags or func in _RESHAPING_OPS)
    # (attention stays one op: the device runs it fused, attention.py)
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    bits |= _COMPOSITE * (composite and func is not aten.scaled_dot_product_attention.default)
    return bits
_GATHER_INTO_TENSOR = torch.ops.c10d._allgather_base_.default if torch.distributed.is_available() else None
_WORK = torch._C._distributed_c10d.Work if torch.distributed.is_available() else None


def _stack_gathered(hosts: list, wrappers: dict) -> None:
    """``all_gather_into_tensor``: HCCL (as NCCL) takes an output of any shape with the ranks' inputs' elements
    (Accelerate's gather passes a flat one); gloo underneath wants them stacked along dim 0, so it gets a view
    of the output of that shape (the op still returns the caller's tensor)."""
    out, one = hosts[0], hosts[1]
    if one.dim() == 0 or one.numel() == 0 or not out.is_contiguous() or out.numel() % one.numel():
        return
    view = out.view(out.numel() // one.numel() * one.shape[0], *one.shape[1:])
    if id(out) in wrappers:
        wrappers[id(view)] = wrappers[id(out)]
    hosts[0] = view


def _completed(out):
    """A collective's result once its work is done. On Gaudi the device runs what is issued after a collective
    after it (``all_reduce(buffer, async_op=True)`` then reading ``buffer``, as Optimum's fast DDP does); gloo runs
    async work on its own threads, so the device waits for it here."""
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.ScriptObject):  # the op's Work, boxed as the dispatcher returns it
            _WORK.unbox(leaf).wait()
    return out


def _mixed(first, second) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{first} and {second}!")


def _wrap(out, wrappers: dict, device):
    def one(t):
        found = wrappers.get(id(t))
        return found if found is not None else HpuTensor(t, device)
    if type(out) is torch.Tensor:
        return one(out)
    if (type(out) is tuple or type(out) is list) and all(type(t) is torch.Tensor or t is None for t in out):
        return type(out)(t if t is None else one(t) for t in out)
    return pytree.tree_map_only(torch.Tensor, one, out)


LOADER_FRAMES = 40  # frames looked through, from a copy outward, for a DataLoader the copied batch came from


def data_loader_in_use() -> bool:
    """Whether a frame calling now holds a torch DataLoader or its iterator in a name (``for x, y in loader``):
    only then is "more DataLoader workers" a remedy for a host that waits for its input."""
    from torch.utils.data import DataLoader

    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter as LoaderIter
    except ImportError:  # torch internals moved: a loader kept in a name is still seen
        LoaderIter = DataLoader
    frame = sys._getframe(1)
    for _ in range(LOADER_FRAMES):
        if frame is None:
            return False
        if any(isinstance(v, (DataLoader, LoaderIter)) for v in frame.f_locals.values()):
            return True
        frame = frame.f_back
    return False
