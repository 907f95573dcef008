"""HPU Graphs: a module's call captured once per input signature, then replayed as one straight-line run.

Gaudi's ``wrap_in_hpu_graph(module)`` records the device work of a static-shape call and replays it
with no host-side framework work: inputs are copied into the graph's static input buffers and the
recorded launches run again. Here a capture is ``torch.export`` of the call, lowered to one recipe
(the same passes and recipes as ``torch.compile(backend="hpu_backend")``), whose executor binds the
module's parameters, buffers and constants once (views of them, such as transposed weights, are
taken once too); a replay copies the call's tensors into the static buffers and runs that executor:
no Dynamo, no guards, no AOTAutograd wrapper, no module tree walk.

A call that updates its inputs or the module's buffers in place (a decode step writing its new keys and
values into a KV cache) is captured with those writes: after a replay, the updated values are in the
caller's tensors and the module's buffers, as after a Gaudi graph replay. The wrapper keeps the forward's
signature (``inspect.signature``), which ``generate()`` reads to pass ``attention_mask`` and the cache.

Caveats, as on Gaudi: what the capture saw is what replays — Python control flow and side effects
run once, at capture; non-tensor arguments (and train/eval mode) are part of the signature, so each
new value captures again (an unhashable one runs the module eagerly); a parameter replaced by a new object
(rather than updated in place) is not seen; a replay runs without autograd (HPU graphs serve inference).
Unlike Gaudi, outputs are fresh tensors, not buffers the next replay overwrites: a script correct on Gaudi is
correct here, not the reverse.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import logging
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import metrics
from ..serve import fallback
from ..serve.compiled import static_buffer
from ..capture.exported import decompose, graph_inputs, lower_exported
from ..lowering import LoweringError
from ..errors import one_line
from ..formats.package import PackageError
from ..runtime import RecipeLoadError, build_callable
from ..serve.session import Session, process_observers
from ..settings import Settings
from ..timeline.record import launching
from ..device import graphs as device_graphs
from ..device.graphs import HPUGraph, HPUGraphError  # noqa: F401  (Intel's graphs module has them too)

log = logging.getLogger(__name__)


def wrap_in_hpu_graph(module: torch.nn.Module, asynchronous: bool = False, disable_tensor_cache: bool = False,
                      dry_run: bool = False, max_graphs: int | None = None) -> torch.nn.Module:
    """Gaudi's ``habana_frameworks.torch.hpu.wrap_in_hpu_graph``: ``module`` (returned, wrapped in place)
    replays a captured graph per input signature, keeping at most ``max_graphs`` (None: no limit).

    ``asynchronous``, ``disable_tensor_cache`` and ``dry_run`` are accepted for compatibility and
    change nothing: the simulated device runs on the host, synchronously, and keeps no output cache.
    """
    if not isinstance(module.__dict__.get("forward"), HPUGraphForward):
        module.forward = HPUGraphForward(module, module.forward, max_graphs)
    return module


class HPUGraphForward:
    """The forward of a wrapped module: signature of the call → captured graph → replay."""

    def __init__(self, module: torch.nn.Module, forward: Callable, max_graphs: int | None):
        self.module = module
        self.module_name = type(module).__name__
        self.forward = forward  # the module's own forward: captured, and the fallback
        self.__signature__ = _signature(forward)  # what callers inspect (generate() looks for attention_mask)
        self.unwrapped = _Unwrapped(module, forward)  # what export traces (module.forward is this object)
        self.max_graphs = max_graphs
        self.graphs: collections.OrderedDict[tuple, CapturedGraph | None] = collections.OrderedDict()
        self.captures = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not all(type(a) is torch.Tensor for a in args):
            return self._call_general(args, kwargs)
        key = (self.module.training, *((a.shape, a.dtype, a.device) for a in args))
        graph = self.graphs.get(key, False)
        if graph is False:
            graph = self._capture(key, args, {})
        return self.forward(*args) if graph is None or graph.needs_autograd(args) else graph.replay(args)

    def _call_general(self, args: tuple, kwargs: dict) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        key = (self.module.training, spec, *((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor)
                                             else (type(a), a) for a in flat))
        try:
            graph = self.graphs.get(key, False)
        except TypeError:  # an unhashable argument cannot name a graph: the module runs as it is
            return self.forward(*args, **kwargs)
        if graph is False:
            graph = self._capture(key, args, kwargs)
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if graph is None or graph.needs_autograd(tensors):
            return self.forward(*args, **kwargs)
        return graph.replay(tensors)

    def _capture(self, key: tuple, args: tuple, kwargs: dict) -> CapturedGraph | None:
        """Capture the call; None (the module runs eagerly for this signature) after one warning."""
        self.captures += 1
        start = time.perf_counter()
        try:
            graph = capture(self.unwrapped, args, kwargs, f"{self.module_name}_hpu_graph{self.captures}",
                            training=self.module.training)
        except (PackageError, LoweringError, RecipeLoadError) as e:
            log.warning("hpu_backend: HPU graph capture of %s failed, running it eagerly for these inputs: %s",
                        self.module_name, e)
            graph = None
        else:  # a capture compiles a graph, as on Gaudi, where graph_compilation counts it
            metrics.record_compilation(time.perf_counter() - start, "hpu graph capture")
        self.graphs[key] = graph
        if self.max_graphs is not None and len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)  # the oldest capture goes, as Gaudi's max_graphs does
        return graph


class CapturedGraph:
    """One captured call: static input buffers, the executor with the module's state bound, the output layout."""

    def __init__(self, run: Callable[[list], list], static: list[torch.Tensor], out_spec: pytree.TreeSpec,
                 trainable: bool, fallbacks: tuple[str, ...] = (), recipe=None, writes: Writes | None = None):
        self.run = run
        self.writes = writes or Writes([], [], None)
        self.recipe = recipe  # what a replay reports to the run observers (the device's timeline and times)
        self.fallbacks = fallbacks  # CPU-fallback ops, counted at every replay as the bridge does
        self.static = static
        self.out_spec = out_spec
        self.single = out_spec.is_leaf()
        self.trainable = trainable

    def needs_autograd(self, tensors) -> bool:
        """A call that records gradients (of the weights or of an input) runs the module itself: a replay has no
        autograd graph."""
        return torch.is_grad_enabled() and (self.trainable or any(t.requires_grad for t in tensors))

    def replay(self, tensors) -> Any:
        for buffer, value in zip(self.static, tensors):
            buffer.copy_(value)
        if self.fallbacks:
            fallback.executed(self.fallbacks)
        outs = self.run(list(self.static))
        with launching("replay"):  # the timeline charges one replay, not the bridge's per-op dispatch
            for observe in process_observers():
                observe(self.recipe, self.static, outs)
        outs = self.writes.apply(outs, tensors)
        return outs[0] if self.single else pytree.tree_unflatten(outs, self.out_spec)


class Writes:
    """Where a replay puts the values the captured call wrote in place: ``(output, argument)`` pairs for the
    call's tensors (their position among them), ``(output, tensor)`` pairs for the module's buffers, and the
    positions of the call's own outputs among the recipe's (``None``: all of them, nothing written)."""

    def __init__(self, to_args: list[tuple[int, int]], to_buffers: list[tuple[int, torch.Tensor]],
                 returned: list[int] | None):
        self.to_args = to_args
        self.to_buffers = to_buffers
        self.returned = returned

    def apply(self, outs: list, tensors) -> list:
        """Copy the written values into their tensors; the call's outputs."""
        if self.returned is None:
            return outs
        tensors = list(tensors)
        with torch.no_grad():
            for out, arg in self.to_args:
                tensors[arg].copy_(outs[out])
            for out, buffer in self.to_buffers:
                buffer.copy_(outs[out])
        return [outs[i] for i in self.returned]


class _Unwrapped(torch.nn.Module):
    """``module`` called through its own forward, so that exporting it does not replay a graph."""

    def __init__(self, module: torch.nn.Module, forward: Callable):
        super().__init__()
        self.module = module
        self.call = forward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


def capture(module: torch.nn.Module, args: tuple, kwargs: dict, name: str, training: bool = False
            ) -> CapturedGraph:
    """Export ``module`` at exactly these inputs and lower it to one recipe with its state bound (``training``:
    the wrapped module's mode, for the error when a train-mode layer updates its buffers)."""
    with torch.no_grad():
        try:
            with _inner_state(module, args, kwargs) as (args, kwargs):
                ep = torch.export.export(module, args, kwargs, strict=False)
        except Exception as e:  # export reports unsupported Python and data-dependent control flow
            raise PackageError(f"torch.export cannot capture the call: {one_line(e)}") from None
        ep = decompose(ep, training, in_place=True)
        session = Session(Settings.from_options({}))  # a captured graph is bound to its module: nothing stored
        template, ctx = lower_exported(ep, session.settings, name)
        if template.symbols:
            raise PackageError(f"the captured graph has symbolic sizes {template.symbols}")
        (recipe,) = session.recipes(template, ctx, [{}])
        fallbacks = fallback.report(recipe)
        fixed, static, position = _bind(ep, module, recipe.input_names, args, kwargs)
        run = build_callable(recipe, fixed)
    trainable = any(p.requires_grad for p in module.parameters())
    writes = _writes(ep, position, module)
    return CapturedGraph(run, static, ep.call_spec.out_spec, trainable, fallbacks, recipe, writes)


def _signature(forward: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):  # a builtin or C forward has none to show
        return None


def _writes(ep, position: dict[str, int], module: torch.nn.Module) -> Writes:
    """Where each value the call wrote in place goes: a call's tensor (``position``: by its graph input's
    name) or one of ``module``'s buffers."""
    specs = ep.graph_signature.output_specs
    if all(s.kind == OutputKind.USER_OUTPUT for s in specs):
        return Writes([], [], None)
    to_args, to_buffers, returned = [], [], []
    for i, s in enumerate(specs):
        if s.kind == OutputKind.USER_INPUT_MUTATION:
            to_args.append((i, position[s.target]))
        elif s.kind == OutputKind.BUFFER_MUTATION:
            to_buffers.append((i, module.get_buffer(s.target)))
        else:
            returned.append(i)
    return Writes(to_args, to_buffers, returned)


@contextlib.contextmanager
def _inner_state(module: torch.nn.Module, args: tuple, kwargs: dict):
    """Export sees a device module's state and arguments as the tensors a device tensor wraps (its one inner
    tensor, ``__tensor_flatten__``): torch's decomposition of an exported program unwraps subclass parameters
    by parametrizing them, which breaks on a module that is already parametrized (``weight_norm``). The recipe
    is the same either way; only the capture's view of the tensors changes, and binding uses the module's own."""
    params = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    if not any(_inner(t) is not t for t in [*params.values(), *buffers.values()]):
        yield args, kwargs
        return
    state = {**{name: torch.nn.Parameter(_inner(p), p.requires_grad) for name, p in params.items()},
             **{name: _inner(b) for name, b in buffers.items()}}
    with torch.nn.utils.stateless._reparametrize_module(module, state):
        yield pytree.tree_map_only(torch.Tensor, _inner, (args, kwargs))


def _inner(t: torch.Tensor) -> torch.Tensor:
    """A wrapper subclass's one inner tensor (the device's host tensor); any other tensor as it is."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        if len(names) == 1:
            return getattr(t, names[0])
    return t


def _bind(ep, module: torch.nn.Module, names: list[str], args: tuple, kwargs: dict
          ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], dict[str, int]]:
    """The recipe's inputs that are the module's state (by input name), static buffers for the call's tensors,
    and each of those tensors' position among them (by the graph input's name)."""
    state = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False)), **ep.constants}
    user = pytree.tree_leaves((args, kwargs))
    fixed, static, position = {}, [], {}
    for name, gi in zip(names, graph_inputs(ep)):
        if gi.kind == "user" and isinstance(user[gi.index], torch.Tensor):
            value = user[gi.index]
            position[gi.target] = len(static)
            static.append(static_buffer(value).copy_(value))
        elif gi.kind == "user":
            fixed[name] = user[gi.index]  # a non-tensor argument: part of the signature, fixed per graph
        else:
            fixed[name] = state[gi.target].detach()
    return fixed, static, position


class ModuleCacher:
    """Gaudi's ``habana_frameworks.torch.hpu.ModuleCacher`` (HPU graphs for training; Optimum's
    ``use_hpu_graphs_for_training``): ``ModuleCacher(max_graphs)(model=m, inplace=True)`` makes each call of
    ``m`` with a new input signature (shapes, dtypes, non-tensor arguments, train/eval mode) a graph of its
    own, captured once and replayed after; at most ``max_graphs`` signatures are kept (the oldest goes).

    In lazy mode (the only mode Gaudi supports HPU graphs in) the call's forward runs as its own lazy graph:
    the pending graph is cut before it and after it, as a capture boundary is on Gaudi, so a repeated signature
    runs the recipe compiled at its first call, and the backward records against the forward's outputs as
    usual. What a Gaudi saves by a replay, the host's per-op accumulation, is not taken off the simulated host
    time. In eager mode the module runs as it is. ``allow_unused_input``, ``have_grad_accumulation`` and
    ``verbose`` are accepted; ``verbose`` logs each capture.
    """

    def __init__(self, max_graphs: int = 10):
        self.max_graphs = max_graphs

    def __call__(self, model: torch.nn.Module, inplace: bool = True, allow_unused_input: bool = False,
                 verbose: bool = False, have_grad_accumulation: bool = False) -> torch.nn.Module:
        import copy

        target = model if inplace else copy.deepcopy(model)
        if not isinstance(target.__dict__.get("forward"), TrainingGraphForward):
            target.forward = TrainingGraphForward(target, target.forward, self.max_graphs, verbose)
        return target


class TrainingGraphForward:
    """The forward of a module under ``ModuleCacher``: the signatures captured, each call a graph of its own."""

    def __init__(self, module: torch.nn.Module, forward: Callable, max_graphs: int, verbose: bool):
        self.module_name = type(module).__name__
        self.module = module
        self.forward = forward
        self.__signature__ = _signature(forward)
        self.max_graphs = max_graphs
        self.verbose = verbose
        self.signatures: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.captures = 0
        self.replays = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .intel_utils import is_lazy
        from .training import mark_step

        if not is_lazy():
            return self.forward(*args, **kwargs)
        flat, spec = pytree.tree_flatten((args, kwargs))
        key = (self.module.training, spec, *((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor)
                                             else (type(a), repr(a)) for a in flat))
        if key in self.signatures:
            self.replays += 1
            self.signatures.move_to_end(key)
        else:
            self.captures += 1
            if self.verbose:
                log.warning("hpu_backend: %s: HPU graph %d captured for a new input signature",
                            self.module_name, self.captures)
            self.signatures[key] = None
            if len(self.signatures) > self.max_graphs:
                self.signatures.popitem(last=False)
        mark_step()  # the capture's boundaries: the forward is a graph of its own
        out = self.forward(*args, **kwargs)
        mark_step()
        return out


# -- the helpers Gaudi scripts use around ``torch.hpu.HPUGraph`` (a cache of captures keyed by their inputs) --------

graph = device_graphs.graph  # ``torch.hpu.graph``, which Intel's graphs module has too

class CachedParams:
    """A captured graph with its static inputs and outputs, as a script keeps it in its cache of captures."""

    def __init__(self, graph_inputs: Any, graph_outputs: Any, graph: HPUGraph | None = None,
                 asynchronous: bool = False):
        self.graph_inputs = graph_inputs
        self.graph_outputs = graph_outputs
        self.graph = graph
        self.asynchronous = asynchronous


def input_hash(obj: Any) -> int:
    """A hash of a call's inputs that names the capture they can replay: tensors by shape and dtype (their values
    are what a replay changes), everything else by value; lists, tuples and dicts element by element."""
    if isinstance(obj, dict):
        return input_hash(tuple(obj.items()))
    if isinstance(obj, (list, tuple)):
        return hash(tuple(input_hash(x) for x in obj))
    if isinstance(obj, torch.Tensor):
        return hash((tuple(obj.shape), obj.dtype))
    return hash(obj)


def copy_to(dst: Any, src: Any) -> None:
    """Copy each tensor of ``src`` into the tensor at the same place in ``dst`` (nested lists, tuples and dicts
    of the same structure; other values are left as they are): a capture's static inputs refilled in place."""
    if type(dst) is not type(src) and not (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor)):
        raise HPUGraphError(f"copy_to: a {type(src).__name__} cannot be copied into a {type(dst).__name__}")
    if isinstance(dst, dict):
        if list(dst) != list(src):
            raise HPUGraphError(f"copy_to: keys {list(src)} differ from the static inputs' {list(dst)}")
        for key in dst:
            copy_to(dst[key], src[key])
    elif isinstance(dst, (list, tuple)):
        if len(dst) != len(src):
            raise HPUGraphError(f"copy_to: {len(src)} values for {len(dst)} static inputs")
        for d, s in zip(dst, src):
            copy_to(d, s)
    elif isinstance(dst, torch.Tensor):
        with torch.no_grad():
            dst.copy_(src)
