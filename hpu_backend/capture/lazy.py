"""Lazy graphs: aten ops recorded, not run, into an FX graph that is cut where the host needs a value.

Gaudi's lazy mode accumulates the ops an eager-style script issues into a graph and runs it at
``mark_step()`` or where the host reads a value. ``LazyRecorder`` does the same on the host: a
TorchDispatchMode sees every aten op (forward, backward, optimizer) below autograd; an op that can run
in a recipe is recorded into the pending FX graph and answered with an *unfilled* tensor of the right
shape, strides and dtype (computed on fake tensors); the flush runs the graph (``run(pending)``, given
by the caller: lowered, cached and executed as a recipe) and writes each result into its tensor.

- Graph inputs are the tensors that come from outside the pending graph (parameters, data, optimizer
  state); outputs are the unfilled storages something still holds (a tensor, a view of one, autograd's
  saved values: a weak reference to each storage tells). Mutated inputs are written back by the graph
  with ``copy_`` (as AOTAutograd keeps input mutations), so an in-place update (``param.add_``, gradient
  accumulation) lands in the real tensor.
- An in-place op is recorded as its functional twin (``add_`` → ``add``); views are taken for real on
  the unfilled tensors (so they alias what the flush fills) and recorded too.
- A Python float argument that changes between calls from the same user line (an optimizer's bias corrections
  and step size, a scheduled learning rate) becomes a 0-d float32 input of the graph from its second value on,
  so the graph keeps one structure from step to step instead of compiling again for each new constant.
- Whatever cannot go in a recipe (data-dependent shapes, ops outside the runtime allowlist, a
  generator argument, a write through a view of a pending tensor) cuts the graph if it touches it and runs
  eagerly. A write into a view of an input (a slice of a flat buffer: DeepSpeed's gradient buckets) is written
  back into that view; aliases of the storage read later in the graph cut it only if they overlap what was
  written.
- A TorchFunctionMode sees host reads (``item``, ``tolist``, printing, ``bool()`` in control flow,
  ``data_ptr``, ``cpu``, ``numpy``, and every way to the raw bytes: ``untyped_storage`` that ``torch.save``
  and pickle go through, ``__array__``, ``__dlpack__``): each is a sync, reported with the user's source
  line, and cuts the graph when it reads a pending value.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime import ops
from .args import flatten, unflatten

aten = torch.ops.aten

# Tensor methods through which the host reads values (a device-to-host copy on Gaudi). Besides the value reads,
# every way to the raw bytes: the storage (``torch.save`` and pickle serialize it, a buffer or ctypes reads it),
# the address, DLPack and NumPy (their buffers share the memory). Gaudi syncs before each; so must we, or a
# checkpoint holds what the storage held before the pending graph. (``torch.utils.dlpack.to_dlpack`` is a C
# function torch never offers to a mode: ``torch.from_dlpack`` and ``numpy.from_dlpack`` go by ``__dlpack__``.)
HOST_READS = {getattr(torch.Tensor, name): name for name in (
    "item", "tolist", "numpy", "__repr__", "__format__", "__bool__", "__int__", "__float__", "__index__",
    "data_ptr", "cpu", "__array__", "untyped_storage", "storage", "_typed_storage", "__dlpack__",
    "__reduce_ex__", "__deepcopy__")}

# Files that are not the user's: torch, this package, the standard library.
_NOT_USER = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules[__name__.split(".")[0]]))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def user_line() -> str:
    """``file:line`` of the innermost caller outside torch, hpu_backend and the standard library. (Asked for every
    op the device records: whether a file is the user's is remembered per file name, which a code object Dynamo
    made also has, where the code itself may not be hashable.)"""
    frame = sys._getframe(1)
    known = _USER_FILES
    while frame is not None:
        name = frame.f_code.co_filename
        user = known.get(name)
        if user is None:
            if len(known) >= _USER_FILES_KEPT:
                known.clear()
            user = known[name] = (not name.startswith(_NOT_USER) and not name.startswith(_STDLIB)
                                  and not name.startswith("<frozen"))
        if user:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


_USER_FILES: dict = {}  # file name -> whether it is the user's (see user_line)
_USER_FILES_KEPT = 10_000  # remembered at most (files of code made at run time come and go)


@dataclass
class Pending:
    """A cut graph, ready to run: ``run(inputs)`` must return one tensor per entry of ``fill``.

    ``key`` is the graph's structure as recorded (each op with its arguments, inputs by layout, outputs): equal
    keys are equal graphs, so a runner that has run this structure needs no ``gm`` (None: no stable form).
    ``gm`` is made when first asked for, with a fake value on every input (what lowering reads; the recorder
    asks for it before running a structure the runner does not know)."""

    build: Callable[[], torch.fx.Graph]  # the FX graph of the recorded ops (made only for ``gm``)
    inputs: list[torch.Tensor]
    fill: list[torch.Tensor]  # the tensors the outputs are written into, in output order
    reason: str  # "mark_step" | "Tensor.item" | "op aten.nonzero.default" | ...
    source: str  # the user's line that cut it
    ops: int = 0
    key: tuple | None = None
    convert: Callable[[torch.Tensor], Any] | None = None  # a tensor's fake twin, for inputs not yet given one
    _gm: torch.fx.GraphModule | None = None

    @property
    def gm(self) -> torch.fx.GraphModule:
        if self._gm is None:
            graph = self.build()
            for node, t in zip((n for n in graph.nodes if n.op == "placeholder"), self.inputs):
                if "val" not in node.meta:
                    node.meta["val"] = self.convert(t)
            self._gm = torch.fx.GraphModule(torch.nn.Module(), graph)
        return self._gm


class _ByTensor:
    """A table keyed by tensor identity that does not keep its tensors alive (what torch's WeakIdKeyDictionary
    does, at a fraction of its cost on every recorded op): an entry whose tensor died is never found, even when a
    new tensor gets its id."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: dict[int, tuple] = {}  # id -> (weak reference, value)

    def get(self, t: torch.Tensor, default=None):
        entry = self.entries.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else default

    def __contains__(self, t: torch.Tensor) -> bool:
        entry = self.entries.get(id(t))
        return entry is not None and entry[0]() is t

    def __setitem__(self, t: torch.Tensor, value) -> None:
        entry = self.entries.get(id(t))
        self.entries[id(t)] = (entry[0] if entry is not None and entry[0]() is t else weakref.ref(t), value)


class _Node:
    """A recorded op (or input) of the pending graph: what an FX node holds, made without FX's bookkeeping, which
    cost more than recording itself; the FX graph is made from these only when a graph is new (``_fx_graph``)."""

    __slots__ = ("op", "target", "args", "kwargs", "meta", "pos")

    def __init__(self, op: str, target, args: tuple, kwargs: dict, pos: int):
        self.op, self.target, self.args, self.kwargs, self.meta, self.pos = op, target, args, kwargs, {}, pos


@dataclass
class _Graph:
    """The graph being recorded, and what it knows of the tensors it touched."""

    nodes: list = field(default_factory=list)  # _Node, in order
    node_of: "_ByTensor" = field(default_factory=lambda: _ByTensor())  # tensor -> its current node
    fresh: "_ByTensor" = field(default_factory=lambda: _ByTensor())  # recorded tensor -> owns its storage
    stale: "_ByTensor" = field(default_factory=lambda: _ByTensor())  # aliases of a tensor written here
    inputs: dict = field(default_factory=dict)  # id -> (tensor, placeholder), strongly held until the flush
    written: dict = field(default_factory=dict)  # id(tensor) -> (tensor, its input's node, final node)
    of_inputs: set = field(default_factory=set)  # nodes whose values are inputs' memory: placeholders, their views
    recorded: dict = field(default_factory=dict)  # storage pointer -> weakrefs of recorded tensors on it
    unfilled: dict = field(default_factory=dict)  # storage pointer -> [weak storage, node of its value]
    input_storages: dict = field(default_factory=dict)  # storage pointer -> the inputs on it
    written_storages: dict = field(default_factory=dict)  # storage of inputs this graph writes -> byte spans
    seeded: bool = False  # holds a random op (it draws from the global generator at the flush)
    ops: int = 0
    key: list | None = field(default_factory=list)  # the structure so far (None: something has no stable form)

    def add(self, op: str, target, args: tuple, kwargs: dict) -> _Node:
        node = _Node(op, target, args, kwargs, len(self.nodes))
        self.nodes.append(node)
        return node


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else 0


def _pending(g: "_Graph", ptr: int) -> bool:
    """Whether the storage at address ``ptr`` is one the graph will fill: the address of one that died since may
    already hold a new, real tensor's (the allocator reuses addresses), which is no pending tensor."""
    entry = g.unfilled.get(ptr)
    return entry is not None and not entry[0].expired()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage ``t`` may touch: [first, last + 1)."""
    size = t.element_size()
    first = t.storage_offset() * size
    if not t.numel():
        return first, first
    return first, first + size * (1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())))


def _overlaps(t: torch.Tensor, spans) -> bool:
    lo, hi = _span(t)
    return any(lo < b and a < hi for a, b in spans)


class _Unrecordable(Exception):
    """An op the pending graph cannot hold (it runs eagerly)."""


class LazyRecorder(TorchDispatchMode):
    """Records aten ops into the pending graph; ``run(Pending)`` executes a cut graph; ``on_sync(what, line,
    cut)`` hears of every host read."""

    def __init__(self, run: Callable[[Pending], list[torch.Tensor]], on_sync: Callable[[str, str, bool], None],
                 known: Callable[[tuple], bool] = lambda key: False):
        super().__init__()
        self.run = run
        self.known = known  # whether ``run`` has run a graph of this structure key (it needs no ``gm`` then)
        self.on_sync = on_sync
        self.g = _Graph()
        self._fake_mode = None  # made at the first recorded op: making one imports Dynamo (≈1 s)
        self.layouts: dict = {}  # op and input layouts -> its fake outputs
        self.scalars = _VaryingScalars()
        self.host = _HostReads(self)

    @property
    def fake_mode(self):
        """The fake-tensor mode that infers what each recorded op returns."""
        if self._fake_mode is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self._fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        return self._fake_mode

    # -- the flush -------------------------------------------------------------------------------------------

    def pending(self) -> bool:
        return self.g.ops > 0

    def flush(self, reason: str, source: str = "") -> bool:
        """Run the pending graph (if any) and fill its tensors; True if a graph ran."""
        g, self.g = self.g, _Graph()
        if not g.ops:
            return False
        fill, outs = _outputs(g)
        g.unfilled.clear()  # our references to the storages go with it
        written = [(placeholder, final) for _, placeholder, final in g.written.values()]
        key = None
        if g.key is not None:
            key = (*g.key, tuple(n.pos for n in outs), tuple((p.pos, f.pos) for p, f in written),
                   torch.are_deterministic_algorithms_enabled())
        nodes = g.nodes
        pending = Pending(lambda: _fx_graph(nodes, written, outs), [t for t, _ in g.inputs.values()], fill, reason,
                          source or user_line(), g.ops, key, self._convert)
        if key is None or not self.known(key):
            pending.gm  # noqa: B018 - lowered: made now, before the run
        # inference mode: the graph may fill, or write back into, tensors made under torch.inference_mode(), which
        # only inference mode writes (it writes any other tensor too)
        with no_dispatch(), torch.inference_mode(), torch._C.DisableTorchFunction():
            values = self.run(pending)
            for t, v in zip(fill, values):
                t.copy_(v)
        return True

    # -- recording -------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.dispatch(func, args, kwargs or {})

    def dispatch(self, func, args: tuple, kwargs: dict):
        """Record ``func`` (or run it eagerly when no graph can hold it). The hpu device calls this directly: torch
        wraps a mode's ``__torch_dispatch__`` in a Dynamo-disabling function, a cost on every op, and the device's
        own entry already keeps Dynamo out."""
        with torch._C.DisableTorchFunction():  # torch's own calls in here are no host reads of the user's
            try:
                return self._record(func, args, kwargs)
            except _Unrecordable as e:
                return self._eager(func, args, kwargs, str(e))

    def _record(self, func, args, kwargs):
        if func is aten._assert_tensor_metadata.default:  # a check of metadata, which pending tensors have: run
            with no_dispatch():                             # as on the CPU (its own error), nothing recorded
                return func(*args, **kwargs)
        facts = _facts(func)
        if type(facts) is str:
            raise _Unrecordable(facts)
        target, writes, viewing, name = facts
        if not ops.is_allowed(name):  # (asked each time: the allowlist's answers are its own to cache)
            raise _Unrecordable("outside the runtime allowlist")
        schema = func._schema
        if target is not func:  # the twin may default an argument differently (bernoulli_'s p): pass all
            args, kwargs = _positional(schema, args, kwargs)
        varying = self.scalars.varying(target, args, kwargs)
        if varying:
            target, args, kwargs = self._as_inputs(target, args, kwargs, varying)
        flat, spec = flatten(args, kwargs)
        if any(isinstance(a, (torch.Generator, torch.SymInt, torch.SymFloat, torch.UntypedStorage)) for a in flat):
            raise _Unrecordable("takes a generator, storage or symbolic value")
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if viewing and not any(self._touched(t) for t in tensors):
            with no_dispatch():
                return func(*args, **kwargs)  # a view of real values is real: nothing to record
        mutated = _written_args(schema, writes, args, kwargs)
        g = self.g
        if any(not g.fresh.get(t, True) and id(t) not in g.written and g.node_of.get(t) not in g.of_inputs
               for t in mutated):
            raise _Unrecordable("writes through a view of a pending tensor")
        fakes = self._fake_out(target, flat, spec)
        if not schema.returns and not writes:  # a check: it ran on the fakes
            return None
        stale = next((why for t in tensors if (why := self._stale(t, viewing))), "")
        if stale:
            self.flush(f"{func} reads {stale}", user_line())
        stale_source = viewing and self._stale(tensors[0])
        out = self._add(func, target, flat, spec, fakes, mutated, viewing)
        if stale_source:  # a view reads no values: it is stale only where it overlaps what the graph wrote
            for view in pytree.tree_leaves(out):
                if isinstance(view, torch.Tensor) and _overlaps(view, self.g.written_storages.get(_storage(view), ())):
                    self.g.stale[view] = True
        return out

    def _as_inputs(self, target, args: tuple, kwargs: dict, varying: dict) -> tuple[Any, tuple, dict]:
        """The call with its varying floats as float32 tensors, which the graph takes as inputs: a number as a 0-d
        tensor; for a foreach op (an optimizer's step sizes and bias corrections, one per parameter), through its
        overload that takes tensors (``TENSOR_TWINS``). A varying ``value`` of addcdiv/addcmul multiplies
        ``tensor1`` first (the kernel's own order of operations)."""
        names = [a.name for a in target._schema.arguments]
        args, kwargs = list(args), dict(kwargs)

        def put(name: str, value) -> None:
            i = names.index(name)
            if i < len(args):
                args[i] = value
            else:
                kwargs[name] = value

        def lifted(value):
            with no_dispatch():
                scalar = torch.tensor(value, dtype=torch.float32)
            self._node_for(scalar)  # an input now: its address may be a freed pending storage's, not its value
            return scalar

        twin = TENSOR_TWINS.get(target)
        for name, value in varying.items():
            if twin is not None and twin[1] == "fold":  # value * tensor1 first, as for addcdiv below
                i = names.index("tensor1")
                put("tensor1", self._record(aten._foreach_mul.List, (args[i], [lifted(v) for v in value]), {}))
                put(name, 1.0)
            elif twin is not None:
                put(name, [lifted(v) for v in value] if twin[1] == "each" else lifted(value))
            elif name == "value":
                i = names.index("tensor1")
                put("tensor1", self._record(aten.mul.Tensor, (args[i], lifted(value)), {}))
                put("value", 1.0)
            else:
                put(name, lifted(value))
        return (twin[0] if twin is not None else target), tuple(args), kwargs

    def _stale(self, t: torch.Tensor, viewing: bool = False) -> str:
        """Why, read in this graph, ``t`` would miss a value the graph has not written yet ("": it would not).
        ``viewing``: read by a view op, which reads no values (the view itself may be stale, see ``_record``)."""
        g = self.g
        if t in g.node_of:
            return "an alias of a tensor the graph wrote" if g.stale.get(t, False) and not viewing else ""
        ptr = _storage(t)
        if _pending(g, ptr):
            return "a tensor made from a pending one (nn.Parameter(torch.empty(...)), .data)"
        wrote = not viewing and _overlaps(t, g.written_storages.get(ptr, ()))
        return "an alias of a tensor the graph wrote" if wrote else ""

    def _touched(self, t: torch.Tensor) -> bool:
        g = self.g
        ptr = _storage(t)
        return t in g.node_of or _pending(g, ptr) or ptr in g.written_storages or ptr in g.input_storages

    def _fake_out(self, target, flat, spec):
        """The op's outputs as fake tensors: remembered per op and input layout, since a training loop issues
        the same ops on the same layouts every step (running an op on fake tensors costs milliseconds)."""
        key = _layout_key(target, flat, spec)
        found = self.layouts.get(key) if key is not None else None
        if found is None:
            found = self._run_fake(target, flat, spec)
            if key is not None:
                if len(self.layouts) >= _LAYOUTS:
                    self.layouts.clear()
                self.layouts[key] = found
        return found

    def _run_fake(self, target, flat, spec):
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        fake = [self._fake(a) if isinstance(a, torch.Tensor) else a for a in flat]
        fargs, fkwargs = unflatten(fake, spec)
        try:
            with self.fake_mode:
                out = target(*fargs, **fkwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise _Unrecordable("its result's shape depends on values") from e
        except (NotImplementedError, RuntimeError, TypeError) as e:
            raise _Unrecordable(f"no shape function ({type(e).__name__}: {e})") from e
        leaves = pytree.tree_leaves(out)
        if any(not isinstance(x, torch.Tensor) and x is not None for x in leaves):
            raise _Unrecordable("returns a host value")
        return out

    def _fake(self, t: torch.Tensor):
        """A fake twin of ``t``: the one its node already has, else made (converting a tensor is not cheap)."""
        node = self.g.node_of.get(t)
        if node is None:
            return self._convert(t)
        if "val" not in node.meta:  # an input, converted only when an op's layout is new
            node.meta["val"] = self._convert(t)
        return node.meta["val"]

    def _convert(self, t: torch.Tensor):
        """A fake tensor with ``t``'s layout, made from a meta tensor of it: no dispatch is needed (a flush may come
        inside the device's own kernels, under ``no_dispatch()``), and it is an order of magnitude cheaper than
        torch's converter, which describes the tensor's autograd and view history that a lazy graph's input does
        not have (it is recorded below autograd)."""
        shape, stride, offset = t.shape, t.stride(), t.storage_offset()
        with no_dispatch():
            if offset:
                span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if t.numel() else 0
                meta = torch.empty(offset + span, dtype=t.dtype, device="meta").as_strided(shape, stride, offset)
            else:
                meta = torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
        mode = self.fake_mode
        return mode.fake_tensor_converter.from_meta_and_device(mode, meta, t.device)

    def _add(self, func, target, flat, spec, fakes, mutated, viewing):
        g = self.g
        nargs, nkwargs = unflatten([self._node_for(a) if isinstance(a, torch.Tensor) else a for a in flat], spec)
        node = g.add("call_function", target, tuple(nargs), nkwargs)
        node.meta["val"] = fakes
        node.meta["source"] = line = user_line()  # "file:line", for reports
        node.meta["stack_trace"] = _trace(line)  # where capture reads a recipe node's source
        custom = fx_traceback.current_meta.get("custom")
        if custom:  # the user's annotations (FusedSDPA's recompute choice), as a tracer records them
            node.meta["custom"] = dict(custom)
        self._keyed(node, target, _key_of(nargs), _key_of(nkwargs), _key_of(node.meta.get("custom")))
        g.ops += 1
        g.seeded = g.seeded or torch.Tag.nondeterministic_seeded in func.tags
        if func._schema.is_mutable:
            values = [self._item(node, i, f) for i, f in enumerate(fakes)] if isinstance(fakes, (list, tuple)) \
                else [node]
            for t, v in zip(mutated, values):
                self._write(t, v)
            return unflatten(flat, spec)[0][0] if func._schema.returns else None
        if viewing:
            with no_dispatch():
                args, kwargs = unflatten(flat, spec)
                real = func(*args, **kwargs)
            if nargs and nargs[0] in g.of_inputs:
                g.of_inputs.add(node)  # a view of an input's memory (where it is stale, it cuts the graph first)
        elif isinstance(fakes, torch.Tensor):
            real = _unfilled(fakes)
        else:
            real = pytree.tree_map(_unfilled, fakes)
        self._bind(real, node, fresh=not viewing)
        return real

    def _write(self, t: torch.Tensor, value: _Node) -> None:
        """``t`` now holds ``value``: aliases of its storage read in this graph are stale; an input is written
        back at the end of the graph."""
        g = self.g
        ptr = _storage(t)
        span = _span(t)
        sharing = [r() for r in g.recorded.get(ptr, ())] + g.input_storages.get(ptr, [])
        for other in sharing:
            if other is not None and other is not t and _overlaps(other, (span,)):
                g.stale[other] = True
        if _pending(g, ptr):
            g.unfilled[ptr][1] = value
        target = g.written[id(t)][1] if id(t) in g.written else g.node_of.get(t)
        if target in g.of_inputs:  # an input or a view of one: written back at the end
            g.written[id(t)] = (t, target, value)
            if ptr:
                g.written_storages.setdefault(ptr, []).append(span)
        g.node_of[t] = value

    def _item(self, node, i, fake):
        item = self.g.add("call_function", operator.getitem, (node, i), {})
        item.meta["val"] = fake
        self._keyed(item, i, node.pos)
        return item

    def _keyed(self, node: _Node, *parts) -> None:
        """``node`` joins the graph's structure key (which gives up at a part with no stable hash)."""
        g = self.g
        if g.key is not None:
            if any(p is _UNKEYED for p in parts):
                g.key = None
            else:
                g.key.append(parts)

    def _bind(self, real, node, fresh: bool) -> None:
        g = self.g
        if isinstance(real, torch.Tensor):
            g.node_of[real] = node
            g.fresh[real] = fresh
            ptr = _storage(real)
            g.recorded.setdefault(ptr, []).append(weakref.ref(real))
            if fresh and ptr:  # (an address seen before in this graph was freed: its storage is gone)
                g.unfilled[ptr] = [StorageWeakRef(real.untyped_storage()), node]
            return
        for i, r in enumerate(real):
            if r is not None:
                self._bind(r, self._item(node, i, node.meta["val"][i]), fresh)

    def _node_for(self, t: torch.Tensor) -> _Node:
        g = self.g
        node = g.node_of.get(t)
        if node is not None:
            return node
        node = g.add("placeholder", f"input_{len(g.inputs)}", (), {})  # its fake value: made when something needs it
        g.inputs[id(t)] = (t, node)
        g.input_storages.setdefault(_storage(t), []).append(t)
        g.node_of[t] = node
        g.of_inputs.add(node)
        self._keyed(node, "input", type(t), t.shape, t.stride(), t.storage_offset(), t.dtype, t.requires_grad)
        return node

    def track(self, t: torch.Tensor) -> None:
        """Make ``t`` an input of the pending graph, so that views of it are recorded rather than taken for real:
        on the hpu device a view is a graph op (``steps[i]`` puts its constant ``i`` in the graph, as on Gaudi)."""
        if not self._touched(t):
            self._node_for(t)

    # -- ops that run eagerly --------------------------------------------------------------------------------

    def _eager(self, func, args, kwargs, why: str):
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        seeded = isinstance(func, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in func.tags
        if self.pending() and (any(self._touched(t) for t in tensors) or seeded and self.g.seeded):
            source = user_line()
            self.flush(f"{func} runs on the host: {why}", source)
            self.on_sync(f"{func} ({why})", source, True)
        with no_dispatch():
            return func(*args, **kwargs)


def _outputs(g: _Graph) -> tuple[list[torch.Tensor], list[_Node]]:
    """Each unfilled storage something still holds (a tensor, a view or alias of it, autograd's saved values),
    as a tensor over all of it, with the node whose value fills it."""
    fill, outs = [], []
    # storage addresses are reused: order by the graph
    for ref, node in sorted(g.unfilled.values(), key=lambda entry: entry[1].pos):
        if not ref.expired():
            fake = node.meta["val"]
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            with no_dispatch():
                whole = torch.empty(0, dtype=fake.dtype, device=fake.device)
                fill.append(whole.set_(storage, 0, fake.shape, fake.stride()))
            outs.append(node)
    return fill, outs


_LAYOUTS = 50_000  # remembered op layouts; the table is cleared when it holds this many
_UNKEYED = object()
_KEYED_TYPES = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _key_of(a):
    """An argument in the structure key's terms: a node by its position, a value as itself with its type (1 and
    1.0 and True differ), containers element-wise; ``_UNKEYED`` for anything else."""
    if type(a) is _Node:
        return ("%", a.pos)
    if a is None:
        return None
    if type(a) is float:  # by its bits: -0.0 and 0.0 give different graphs
        return (float, a.hex())
    if type(a) in _KEYED_TYPES:
        return (type(a), a)
    if type(a) is list or type(a) is tuple:
        parts = tuple(_key_of(x) for x in a)
        return _UNKEYED if any(p is _UNKEYED for p in parts) else (type(a), parts)
    if type(a) is dict:
        parts = tuple((k, _key_of(v)) for k, v in a.items())
        return _UNKEYED if any(p is _UNKEYED for _, p in parts) else (dict, parts)
    return _UNKEYED


class _VaryingScalars:
    """Python floats that changed between two calls of an op from the same user line (an optimizer's bias
    corrections and step size, a scheduled learning rate). From the second value on, such an argument is a 0-d
    float32 input of the graph, so the graph keeps one structure from step to step, as Gaudi's optimizers take
    these values as device tensors; a float that never changes stays a constant of the graph."""

    def __init__(self):
        self.last: dict = {}  # (op, user line, argument name) -> the value seen last
        self.lifted: set = set()

    def varying(self, target, args: tuple, kwargs: dict) -> dict[str, float]:
        """The arguments of this call to pass as tensors, by name (none when no float argument can be one)."""
        if target not in TENSOR_TWINS and not any(type(v) is float for v in args) \
                and not any(type(v) is float for v in kwargs.values()):
            return {}
        named = _named(_arguments(target), args, kwargs)
        if target in TENSOR_TWINS:
            floats = _foreach_numbers(named)
        else:
            floats = {a.name: v for a, v in named if type(v) is float and _liftable(target, a)}
            # A 0-d float32 tensor promotes as a Python number does only beside a tensor with dimensions.
            if floats and not any(isinstance(v, torch.Tensor) and v.dim() for _, v in named):
                return {}
        if not floats:
            return {}
        line, out = user_line(), {}
        if len(self.last) >= _LAYOUTS:
            self.last.clear()
        for name, value in floats.items():
            key = (target, line, name)
            if key not in self.lifted and self.last.get(key, value) != value:
                self.lifted.add(key)
            self.last[key] = value
            if key in self.lifted:
                out[name] = value
        return out


@functools.cache
def _arguments(target) -> tuple:
    """An op's schema arguments (torch makes the list anew at each ``schema.arguments``: tens of µs)."""
    return tuple(target._schema.arguments)


def _named(arguments: tuple, args: tuple, kwargs: dict) -> list:
    """(schema argument, value) of each argument given."""
    given = list(zip(arguments, args))
    return given + [(a, kwargs[a.name]) for a in arguments[len(args):] if a.name in kwargs]


def _liftable(target, argument) -> bool:
    """Whether a float can be passed as a 0-d tensor: a Tensor argument given a number (``t / 0.5``), or the
    ``value`` of addcdiv/addcmul (folded into ``tensor1``)."""
    if isinstance(argument.type, torch.TensorType):
        return True
    return argument.name == "value" and target in (aten.addcdiv.default, aten.addcmul.default)


# Foreach ops whose numbers (one, or one per tensor) have an overload taking them as tensors: (that overload, how
# it takes them: "one" 0-d tensor, or "each" number as a 0-d tensor; "fold": addcdiv/addcmul with one number per
# tensor, whose tensor overload reads its numbers on the host, become ``tensor1`` times each number, then the
# overload with one number, 1.0). Lifted only over float32 tensors, where the kernel computes in float32 either way.
TENSOR_TWINS = {
    aten._foreach_add.Scalar: (aten._foreach_add.Tensor, "one"),
    aten._foreach_mul.Scalar: (aten._foreach_mul.Tensor, "one"),
    aten._foreach_div.Scalar: (aten._foreach_div.Tensor, "one"),
    aten._foreach_add.ScalarList: (aten._foreach_add.List, "each"),
    aten._foreach_sub.ScalarList: (aten._foreach_sub.List, "each"),
    aten._foreach_mul.ScalarList: (aten._foreach_mul.List, "each"),
    aten._foreach_div.ScalarList: (aten._foreach_div.List, "each"),
    aten._foreach_addcdiv.ScalarList: (aten._foreach_addcdiv.Scalar, "fold"),
    aten._foreach_addcmul.ScalarList: (aten._foreach_addcmul.Scalar, "fold"),
}


def _foreach_numbers(named: list) -> dict:
    """The numbers argument of a ``TENSOR_TWINS`` op, by name, when its tensors are all float32 ({} otherwise)."""
    tensors, numbers = named[0][1], named[-1]
    value = numbers[1]
    ok = type(value) is float or type(value) is list and value and all(type(x) is float for x in value)
    if not ok or not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors):
        return {}
    return {numbers[0].name: value}


def _layout_key(target, flat: list, spec) -> tuple | None:
    """What an op's output layout depends on: the op, its argument structure and values, and each tensor's
    shape, strides, offset, dtype and device. None when an argument has no stable hash."""
    parts: list = [target, spec]
    for a in flat:
        if isinstance(a, torch.Tensor):
            parts.append((tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device))
        elif a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                         torch.memory_format)):
            parts.append((type(a), a))
        else:
            return None
    return tuple(parts)


def _positional(schema, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` with every positional argument of the schema present (defaults filled in), and the keywords."""
    full = list(args)
    for a in schema.arguments[len(args):]:
        if a.kwarg_only:
            break
        full.append(kwargs[a.name] if a.name in kwargs else a.default_value)
    return tuple(full), {k: v for k, v in kwargs.items() if k not in {a.name for a in schema.arguments[:len(full)]}}


def _written_args(schema, writes: list[int], args, kwargs) -> list[torch.Tensor]:
    found = [args[i] if i < len(args) else kwargs[schema.arguments[i].name] for i in writes]
    return [t for m in found for t in (m if isinstance(m, (list, tuple)) else [m])]


class _HostReads(TorchFunctionMode):
    """Host reads of tensor values: a sync each; cut the pending graph when they read it."""

    def __init__(self, recorder: LazyRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        what = HOST_READS.get(func)
        if what is not None:
            r = self.recorder
            tensors = [a for a in pytree.tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
            cut = r.pending() and any(r._touched(t) for t in tensors)
            source = user_line()
            if cut:
                r.flush(f"Tensor.{what}", source)
            r.on_sync(f"Tensor.{what}", source, cut)
        return func(*args, **(kwargs or {}))




@functools.cache  # ops are never freed, and an op's hash is its identity
def _facts(func) -> tuple | str:
    """What recording an op needs of its schema, asked once per op: (the op the graph holds, the arguments it
    writes, whether it returns a view, its recipe name), or why no graph can hold it."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
        return "not an aten op"
    schema = func._schema
    writes = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    try:
        target = _functional(func, writes) if writes else func
    except _Unrecordable as e:
        return str(e)
    name = ops.op_name(target)
    if name is None:
        return "outside the runtime allowlist"
    return target, writes, not writes and any(r.alias_info is not None for r in schema.returns), name


# In-place ops whose functional twin has another name or overload.
TWINS = {"bernoulli_.float": aten.bernoulli.p, "normal_.default": aten.normal_functional.default}


def _functional(func, writes: list[int]):
    """The functional twin of an in-place op (``add_.Tensor`` → ``add.Tensor``) writing only its first argument."""
    schema = func._schema
    if writes != [0]:
        raise _Unrecordable(f"{func} writes more than its first argument")
    packet = schema.name.split("::", 1)[1]
    named = TWINS.get(f"{packet}.{func._overloadname}")
    if named is not None:
        return named
    if not packet.endswith("_") or packet.startswith("_") and not packet.startswith("_foreach"):
        raise _Unrecordable(f"{func} has no functional twin")
    twin = getattr(getattr(aten, packet[:-1], None), func._overloadname, None)
    if twin is None or twin._schema.is_mutable:
        raise _Unrecordable(f"{func} has no functional twin")
    return twin


def _fx_graph(nodes: list[_Node], written: list[tuple[_Node, _Node]], outs: list[_Node]) -> torch.fx.Graph:
    """The FX graph of recorded nodes: each input written back with ``copy_`` (as AOTAutograd keeps input
    mutations), the outputs in ``outs``' order."""
    graph, made = torch.fx.Graph(), {}

    def arg(a):
        if type(a) is _Node:
            return made[a]
        if type(a) is list or type(a) is tuple:
            return type(a)(arg(x) for x in a)
        if type(a) is dict:
            return {k: arg(v) for k, v in a.items()}
        return a

    for n in nodes:
        if n.op == "placeholder":
            node = graph.placeholder(n.target)
        else:
            node = graph.call_function(n.target, arg(n.args), arg(n.kwargs))
        node.meta.update(n.meta)
        made[n] = node
    for placeholder, final in written:
        graph.call_function(aten.copy_.default, (made[placeholder], made[final]))
    graph.output(tuple(made[n] for n in outs))
    return graph


def _unfilled(fake: Any) -> Any:
    if not isinstance(fake, torch.Tensor):
        return fake
    with no_dispatch():
        return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)


def _trace(line: str) -> str:
    """A user line in the form FX stack traces use (what capture records as a node's source)."""
    if not line:
        return ""
    path, _, number = line.rpartition(":")
    return f'File "{path}", line {number}, in <lazy>'
