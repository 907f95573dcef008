"""Programs at work: recorded when AOTAutograd compiles a Dynamo graph, served on a later hit.

Miss: AOTAutograd traces, our compilers lower each of its graphs, and a ``Recorder`` collects
their templates and key parts, the ShapeEnv's guards over the Dynamo graph's symbols and the
runtime contract (read from AOTAutograd's ``ViewAndMutationMeta``). When the last graph is in (the
backward, for training), the program is stored under the Dynamo graph's key.

Both read or rebuild AOTAutograd internals (its metadata, its runtime wrappers). That is a fast path
with a safety net: a torch whose internals differ from those read here (a renamed field, a moved class)
gets one warning and no programs, and every graph is traced as without them; it never fails a compile.
The program key holds AOTAutograd's configuration and the autocast state (serve/keys.py).

Hit: ``serve`` checks the program's guards on this call's sizes and adds them to Dynamo's
ShapeEnv (so Dynamo guards the frame as if it had traced them), makes each graph a
``CompiledGraph`` from its template (bucket recipes come from the store), and wraps them in the
contract's runtime (runtime/autograd.py). AOTAutograd is neither traced nor called.

Restarts: when AOTAutograd's float pass asks Dynamo to trace again with some float inputs specialized (a
``LayerNorm``'s ``eps``), the first graph's key stores that request ("restart"), and once the second trace's
program is in, the restart names it with the values those floats had (``note_restart``, ``link_restart``). A hit
whose floats have those values serves the second program from the first graph, with those inputs left out, and
checks their values on every call (Dynamo guards no value of an unspecialized float): one trace instead of two.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..formats import symexpr
from .compiled import CompiledGraph, Replay
from .keys import GraphKey, ProgramKey
from ..lowering import LoweringContext, LoweringError, encode_guards
from ..formats.program import MEMORY_FORMATS, Contract, Program, ProgramGraph
from ..formats.recipe import RecipeFormatError
from ..runtime.autograd import inference_call, missing_internals, training_call
from .session import Event, Session, emit
from ..errors import HpuBackendError

log = logging.getLogger(__name__)


class Unsupported(HpuBackendError):
    """An AOTAutograd contract that a program cannot express (the graph is compiled, not stored)."""


# What reading AOTAutograd internals of another shape raises (a renamed field or enum member, a moved class).
DRIFT = (AttributeError, ImportError, TypeError, KeyError, IndexError)
_drift_warned: list[str] = []


def drifted(what: str) -> None:
    """Say once per process that programs are off because torch's internals differ from those read here."""
    if not _drift_warned:
        log.warning("hpu_backend: stored programs are off on torch %s: %s; every graph is traced by "
                    "AOTAutograd instead (correct, but slower to start)", torch.__version__, what)
    _drift_warned.append(what)


# -- miss: record ---------------------------------------------------------------------------------

class Recorder:
    """Collects one Dynamo graph's compiled graphs and stores their program once complete."""

    def __init__(self, pkey: ProgramKey, session: Session, name: str):
        self.pkey, self.session, self.name = pkey, session, name
        self.graphs: dict[str, CompiledGraph] = {}
        self.meta: Any = None
        self.guards: list = []
        self.disable_amp = False
        self.abandoned = False
        self.contract: Contract | None = None  # set once the program is complete and expressible
        self.program: Program | None = None  # set once stored

    def add(self, kind: str, graph: CompiledGraph | None) -> None:
        """Called by each compiler; ``graph`` None means it runs eagerly (no program then)."""
        if graph is None or graph.gkey is None:
            self.abandoned = True
        if self.abandoned:
            return
        if kind != "backward":
            try:
                self._read_tracing_state()
            except DRIFT as e:
                drifted(f"reading the trace's state: {type(e).__name__}: {e}")
                self.abandoned = True
                return
        self.graphs[kind] = graph
        if kind in ("inference", "backward"):
            self._finish("inference" if kind == "inference" else "training")

    def _read_tracing_state(self) -> None:
        tracing = torch._guards.TracingContext.try_get()
        self.meta = getattr(tracing, "fw_metadata", None)
        self.disable_amp = torch._C._is_any_autocast_enabled()
        shape_env = getattr(getattr(tracing, "fake_mode", None), "shape_env", None)
        self.guards = [] if shape_env is None else encode_guards([g.expr for g in shape_env.guards],
                                                                  self.pkey.rename)

    def _finish(self, mode: str) -> None:
        graphs = [self.graphs[k] for k in ("inference",)] if mode == "inference" else [
            self.graphs[k] for k in ("forward", "backward")]
        try:
            contract = contract_of(self.meta, mode, [g.template for g in graphs], self.disable_amp)
            program = Program(mode, [ProgramGraph(g.template, dict(g.gkey.parts), dict(g.gkey.detail))
                                     for g in graphs], contract, list(self.pkey.rename.values()),
                              self.pkey.sources, self.guards)
            program.check()
        except (Unsupported, RecipeFormatError) as e:
            log.info("hpu_backend: %s: compiled, but not stored as a program: %s", self.name, e)
            return
        except DRIFT as e:
            drifted(f"AOTAutograd's metadata: {type(e).__name__}: {e}")
            return
        self.contract = contract
        self.program = program
        self.session.store.put_program(self.pkey, program, self.session.settings, self.name)
        for g in graphs:
            g.stored_in(self.pkey.key)
        emit(Event("program", program=self.pkey.key))

    def replayable(self) -> bool:
        """An inference graph whose runtime contract is only "run it" (what a Replay does)."""
        return "inference" in self.graphs and self.contract is not None and replayable(self.contract)


def replayable(c: Contract) -> bool:
    """A contract a Replay honours by running the graph: no input mutation to mark, autocast left alone."""
    return not c.mutated_inputs and not c.disable_amp


def contract_of(meta: Any, mode: str, templates: list, disable_amp: bool) -> Contract:
    """The runtime contract from AOTAutograd's ViewAndMutationMeta; Unsupported past what we rebuild."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType, SubclassCreationMeta

    if meta is None:
        raise Unsupported("no AOTAutograd metadata")
    _require(meta.num_outputs_aliased == 0 and meta.num_intermediate_bases == 0, "an output aliases")
    _require(meta.num_mutated_inp_runtime_indices == 0, "an input is mutated outside the graph")
    _require(not meta.tokens and not getattr(meta, "num_backward_tokens", 0), "effect tokens")
    _require(not meta.is_rng_op_functionalized and not getattr(meta, "num_graphsafe_rng_states", 0), "RNG state")
    _require(not any(isinstance(m, SubclassCreationMeta) for m in [*meta.subclass_inp_meta,
             *meta.subclass_fw_graph_out_meta, *meta.subclass_tangent_meta]), "tensor subclasses")
    _require(all(i.mutation_type in (MutationType.NOT_MUTATED, MutationType.MUTATED_IN_GRAPH)
                 for i in meta.input_info), "an input mutation")
    first = templates[0]
    contract = Contract(num_inputs=len(first.inputs), mutated_inputs=list(
        meta.mutated_graph_handled_indices_seen_by_autograd), disable_amp=disable_amp)
    if mode == "training":
        _training_contract(contract, meta, len(first.outputs), templates[1], OutputType)
    return contract


def _training_contract(c: Contract, meta: Any, fw_outputs: int, backward, OutputType) -> None:
    c.num_outputs = at = meta.num_forward_returns
    for name, sl in (("saved", meta.tensors_saved_for_backwards_with_vc_check_slice),
                     ("saved_unchecked", meta.tensors_saved_for_backwards_no_vc_check_slice),
                     ("saved_symints", meta.symints_saved_for_backwards_slice)):
        start, stop, step = sl.indices(fw_outputs)
        _require(step == 1, "a strided slice of saved values")
        span = [start, stop] if stop > start else [at, at]  # an empty slice may point anywhere
        setattr(c, name, span)
        at = span[1]
    _require(not len(range(*meta.opaque_objects_saved_for_backwards_slice.indices(fw_outputs))),
             "opaque objects saved for backward")
    c.non_differentiable = [i for i, o in enumerate(meta.output_info) if not o.requires_grad]
    c.unsafe_view = list(meta.unsafe_view_out_indices)
    c.tangents = [i for i, o in enumerate(meta.output_info)
                  if o.output_type in (OutputType.non_alias, OutputType.unsafe_view_alias)
                  and issubclass(o.raw_type, torch.Tensor) and o.requires_grad_for_backward]
    _require(len(meta.subclass_tangent_meta) == len(c.tangents), "tangents that are not plain tensors")
    c.tangent_layouts = [_layout(m) for m in meta.subclass_tangent_meta]
    _require(len(backward.outputs) == c.num_inputs, "backward outputs do not match the inputs")


def _layout(meta: Any) -> Any:
    fmt = getattr(meta, "memory_format", None)
    _require(fmt is not None, "a tangent without a memory format")
    if fmt.memory_format is not None:
        name = str(fmt.memory_format).removeprefix("torch.")
        _require(name in MEMORY_FORMATS, f"tangent memory format {name}")
        return name
    _require(all(isinstance(v, int) for v in [*fmt.size, *fmt.stride]), "a symbolic tangent layout")
    return [list(fmt.size), list(fmt.stride)]


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise Unsupported(what)


# -- hit: serve -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Served:
    """A Dynamo graph served from its stored program."""

    call: Callable[..., list]
    program: Program | None = None
    graphs: list[CompiledGraph] = dataclasses.field(default_factory=list)
    floats: list[list[Any]] = dataclasses.field(default_factory=list)  # float inputs left out (a restart's)


def serve(program: Program, key: str, gm: torch.fx.GraphModule, example_inputs: list, session: Session,
          name_of: Callable[[str], str], reason: str, replay: bool = False,
          floats: list[list[Any]] = ()) -> Served | None:
    """The Dynamo graph served from its program, or None when the program does not apply. A restart serves the
    program it names when the floats have its values, else asks Dynamo to trace again
    (TensorifyScalarRestartAnalysis). ``replay``: an inference graph is replayed (``mode="reduce-overhead"``).
    ``floats``: the graph's inputs the program leaves out, with their values."""
    missing = missing_internals()
    if missing:
        drifted(f"torch lacks {', '.join(missing)}")
        return None
    if program.mode == "restart":
        emit(Event("program", program=key, hit=True))
        served = _serve_target(program, gm, example_inputs, session, name_of, reason, replay)
        if served is None:
            replay_restart(program.specialize)
        _specialize(program.specialize)  # as after a restart: Dynamo's later traces specialize these floats too
        return served
    left_out = {i for i, _ in floats}
    placeholders = [n for i, n in enumerate(_placeholders(gm)) if i not in left_out]
    inputs = [x for i, x in enumerate(example_inputs) if i not in left_out]
    claimed = _unexplained_writes(program.contract, gm, placeholders)
    if claimed:  # a stored contract is data: it may not mutate what the user's graph never writes
        log.warning("hpu_backend: %s: stored program %s mutates inputs %s, which the traced graph never writes; "
                    "quarantined, tracing instead", name_of("program"), key, claimed)
        session.store.discard(key)
        return None
    env = _hints(program, inputs)
    if env is None or not _guards_hold(program, env, name_of("program")):
        log.info("hpu_backend: %s: stored program's guards do not hold for these sizes", name_of("program"))
        return None
    _install_guards(program, placeholders)
    graphs = program_graphs(program, key, session, name_of, reason)
    emit(Event("program", program=key, hit=True))
    call = program_call(program, graphs)
    if replay and program.mode == "inference" and replayable(program.contract):
        call = Replay(graphs[0], inputs, call)
    if floats:
        call = _floats_checked(call, list(floats), len(example_inputs), gm, name_of("program"))
    call = _eager_after_failure(call, gm, session, name_of("program"))
    return Served(call, program, graphs, list(floats))


def _serve_target(restart: Program, gm: torch.fx.GraphModule, example_inputs: list, session: Session,
                  name_of: Callable[[str], str], reason: str, replay: bool) -> Served | None:
    """The program a restart names, served when this call's floats have the values it was traced with."""
    if not restart.target:
        return None
    for i, value in restart.floats:
        if i >= len(example_inputs) or _float_hex(example_inputs[i]) != value:
            log.info("hpu_backend: %s: a float input differs from the stored program's; tracing again",
                     name_of("program"))
            return None
    target = session.store.load_program(restart.target)
    if target is None or target.mode == "restart" or target.contract.num_inputs != len(example_inputs) - len(
            restart.floats):
        return None
    return serve(target, restart.target, gm, example_inputs, session, name_of, reason, replay, restart.floats)


def _float_hex(x: Any) -> str | None:
    """A float input's exact value (``float.hex``; Dynamo passes it as a 0-d tensor), or None for anything else."""
    if isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype.is_floating_point:
        return float(x).hex()
    return float(x).hex() if type(x) is float else None


def _floats_checked(call: Callable[..., list], floats: list[list[Any]], n: int, gm: torch.fx.GraphModule,
                    name: str) -> Callable[..., list]:
    """``call`` on the inputs it takes, while the float inputs it leaves out have the values it was traced with;
    a call with other values runs the Dynamo graph eagerly (correct, not lowered), said once."""
    left_out = {i for i, _ in floats}
    kept = [i for i in range(n) if i not in left_out]
    names = {i: _source_name(gm, i) for i in left_out}  # now: Dynamo drops the graph's meta later
    warned = []

    def run(*args):
        if all(float(args[i]).hex() == value for i, value in floats):
            return call(*[args[i] for i in kept])
        if not warned:
            warned.append(True)
            changed = [names[i] for i, value in floats if float(args[i]).hex() != value]
            log.warning("hpu_backend: %s: float input %s changed since it was compiled; calls with other values "
                        "run eagerly", name, ", ".join(changed))
        return gm.forward(*args)

    return run


def _source_name(gm: torch.fx.GraphModule, index: int) -> str:
    node = _placeholders(gm)[index]
    return _source(node) or node.name


def _source(node: torch.fx.Node) -> str | None:
    """Dynamo's name of what a placeholder reads (``L['self'].ln.eps``), None when it recorded none."""
    return getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def program_graphs(program: Program, key: str, session: Session, name_of: Callable[[str], str],
                   reason: str) -> list[CompiledGraph]:
    """A CompiledGraph per graph of the program, from its template (bucket recipes come from the store)."""
    graphs = []
    for g in program.graphs:
        kind = g.template.kind
        ctx = LoweringContext(settings=session.settings, name=name_of(kind), kind=kind)
        template = dataclasses.replace(g.template, name=ctx.name)
        graphs.append(CompiledGraph.from_template(ctx, template, GraphKey(g.key_parts, g.key_detail),
                                                  session, reason, program=key))
    return graphs


def program_call(program: Program, graphs: list[CompiledGraph]) -> Callable[..., list]:
    """The program's graphs wrapped in its runtime contract (what AOTAutograd's wrappers would do)."""
    if program.mode == "inference":
        return inference_call(graphs[0], program.contract)
    return training_call(*graphs, program.contract)


# -- restarts: the first trace's key names the second trace's program --------------------------------------------

@dataclass
class _Restart:
    compile_id: Any  # Dynamo's frame compile the restart belongs to
    pkey: ProgramKey  # the first trace's
    program: Program  # the restart, stored once the second trace is in (the store writes a key once)
    session: Session
    name: str
    floats: list[list[Any]]  # [input index, float.hex()] of the inputs the second trace leaves out
    kept_sources: list[str] | None  # the first trace's input sources without those: the second trace's


_restarting: list[_Restart] = []  # at most one: the frame compile between its two traces


def note_restart(pkey: ProgramKey, program: Program, gm: torch.fx.GraphModule, example_inputs: list,
                 session: Session, name: str) -> None:
    """Before Dynamo traces again with ``program.specialize`` (float symbols) specialized: which inputs of this
    graph the second trace leaves out, and their values (none unless every specialized float is such an input).
    ``finish_restart`` stores the restart."""
    finish_restart(None, gm)  # this frame compile's earlier restart (its second trace restarted too): stored as it is
    floats, kept, found = [], [], set()
    for i, (node, x) in enumerate(zip(_placeholders(gm), example_inputs)):
        symbol = _specialized_float(node, program.specialize)
        value = _float_hex(x) if symbol else None
        if symbol and value is not None and all(u.target == "item" for u in node.users):
            floats.append([i, value])
            found.add(symbol)
            continue
        source = _source(node)
        kept = kept if isinstance(source, str) and kept is not None else None
        if kept is not None:
            kept.append(source)
    linkable = floats and kept is not None and found == set(program.specialize)
    _restarting.append(_Restart(torch._guards.CompileContext.current_compile_id(), pkey, program, session, name,
                                floats if linkable else [], kept if linkable else None))


def _specialized_float(node: torch.fx.Node, specialize: list[str]) -> str | None:
    """The float symbol of a placeholder Dynamo made of a float (a 0-d tensor read by ``item``), when specialized."""
    memo = getattr(node.meta.get("example_value"), "item_memo", None)
    name = getattr(getattr(getattr(memo, "node", None), "_expr", None), "name", None)
    return name if name in specialize else None


def finish_restart(key: str | None, gm: torch.fx.GraphModule) -> None:
    """Store the noted restart once its frame's second trace is served or compiled: naming the second trace's
    program (``key``, None when it has none) when its graph's inputs are the first one's without the floats."""
    if not _restarting:
        return
    noted = _restarting.pop()
    if noted.compile_id != torch._guards.CompileContext.current_compile_id():
        return  # another frame compile's, which never reached its second trace: dropped (it traces again)
    sources = [_source(n) for n in _placeholders(gm)]
    program = noted.program
    if key is not None and noted.kept_sources is not None and sources == noted.kept_sources:
        program = dataclasses.replace(program, target=key, floats=noted.floats)
    noted.session.store.put_program(noted.pkey, program, noted.session.settings, noted.name)
    emit(Event("program", program=noted.pkey.key))


# Torch-level calls in a Dynamo graph that may write their arguments without an in-place name: batch norm and
# instance norm update running statistics in training mode; setitem and the augmented assignments write.
_WRITERS = ("batch_norm", "instance_norm")
_AUGMENTED = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                        operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                        operator.ixor, operator.ilshift, operator.irshift, operator.imatmul})


def _unexplained_writes(contract: Contract, gm: torch.fx.GraphModule, placeholders: list) -> list[int]:
    """The inputs the contract says the graphs mutate that no node of the Dynamo graph may write (an empty
    list when every claimed mutation has a node that may explain it, or the graph's inputs cannot be matched).
    ``placeholders``: the graph's inputs the contract numbers."""
    if not contract.mutated_inputs or len(placeholders) != contract.num_inputs:
        return []
    index = {n: i for i, n in enumerate(placeholders)}
    roots: dict[torch.fx.Node, frozenset[int]] = {n: frozenset([i]) for n, i in index.items()}
    may_write: set[int] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        flowing = frozenset().union(*(roots.get(a, frozenset()) for a in node.all_input_nodes))
        roots[node] = flowing  # any value may alias what it was computed from
        if _may_write(node):
            may_write |= flowing
    return sorted(set(contract.mutated_inputs) - may_write)


def _may_write(node: torch.fx.Node) -> bool:
    """Whether a Dynamo graph node may write an argument: an in-place method or function (``add_``), an
    ``out=`` or ``inplace=True``, an augmented assignment or setitem, batch or instance norm, a module
    call or a higher-order op (what runs inside is not looked at)."""
    if node.op in ("call_module", "get_attr"):
        return node.op == "call_module"
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    in_place = name.endswith("_") and not name.endswith("__")
    # torch.nn.functional's activations and dropouts take ``inplace`` positionally too (F.relu(x, True))
    functional_flag = getattr(node.target, "__module__", "") == "torch.nn.functional" and True in node.args
    return (in_place or "out" in node.kwargs or node.kwargs.get("inplace") is True or functional_flag
            or node.target in _AUGMENTED
            or any(w in name for w in _WRITERS) or isinstance(node.target, torch._ops.HigherOrderOperator)
            or getattr(getattr(node.target, "_schema", None), "is_mutable", False))


def replay_restart(names: list[str]) -> None:
    """Ask Dynamo to trace again with these float inputs specialized, as AOTAutograd's pass did."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    _specialize(names)
    raise TensorifyScalarRestartAnalysis


def _specialize(names: list[str]) -> None:
    """Dynamo's record of the floats to specialize (its frame conversion clears it on other restarts only)."""
    from torch._dynamo.symbolic_convert import TensorifyState

    for name in names:
        TensorifyState.specialize(name)


def restart_program(specialize: list[str]) -> Program:
    return Program("restart", [], Contract(num_inputs=0), specialize=sorted(specialize))


def _guards_hold(program: Program, env: dict[str, int], name: str) -> bool:
    """Whether the stored guards hold for these sizes; LoweringError (the program is unusable) if one
    cannot be evaluated, e.g. it divides by zero."""
    try:
        return all(symexpr.evaluate(g, env) for g in program.guards)
    except (symexpr.SymExprError, ArithmeticError, TypeError, ValueError) as e:
        raise LoweringError(f"its guards cannot be evaluated ({type(e).__name__}: {e})", graph=name) from None


def _hints(program: Program, example_inputs: list) -> dict[str, int] | None:
    env = {}
    for sym, (i, d) in zip(program.symbols, program.symbol_sources):
        if i >= len(example_inputs):
            return None
        v = example_inputs[i] if d < 0 else example_inputs[i].shape[d]
        v = v.node.hint if isinstance(v, torch.SymInt) else v
        if not isinstance(v, int):
            return None
        env[sym] = v
    return env


def _install_guards(program: Program, placeholders: list[torch.fx.Node]) -> None:
    """Add the program's guards to Dynamo's ShapeEnv: evaluating them on the graph's SymInts does."""
    fakes = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    env = {sym: fakes[i] if d < 0 else fakes[i].shape[d]
           for sym, (i, d) in zip(program.symbols, program.symbol_sources)}
    for tree in program.guards:
        for conjunct in tree[1:] if isinstance(tree, list) and tree[0] == "and" else [tree]:
            try:
                bool(_symbolic(conjunct, env))
            except _NotSymbolic:
                continue  # checked on each new size by CompiledGraph instead


class _NotSymbolic(Exception):
    """A guard shape this evaluator does not turn into a SymBool (or / not)."""


_SYMBOLIC = {"add": lambda *xs: functools.reduce(operator.add, xs),
             "mul": lambda *xs: functools.reduce(operator.mul, xs),
             "max": lambda *xs: functools.reduce(torch.sym_max, xs),
             "min": lambda *xs: functools.reduce(torch.sym_min, xs)}


def _symbolic(tree: Any, env: dict) -> Any:
    if isinstance(tree, str):
        return env[tree]
    if not isinstance(tree, list):
        return tree
    op = tree[0]
    if op in ("and", "or", "not"):
        raise _NotSymbolic(op)
    fn = _SYMBOLIC.get(op) or symexpr.OPS[op][0]
    return fn(*(_symbolic(a, env) for a in tree[1:]))


def _eager_after_failure(call: Callable, gm: torch.fx.GraphModule, session: Session, name: str) -> Callable:
    """``call``, until a new bucket cannot be lowered: then the Dynamo graph runs eagerly (the session's
    ``graph_step`` decides: strict mode raises)."""
    state = {"call": call}

    def eager_from_now(args: tuple) -> Any:
        state["call"] = gm.forward
        return gm.forward(*args)

    def run(*args):
        if state["call"] is not call:
            return state["call"](*args)
        return session.graph_step(name, lambda: call(*args), lambda: eager_from_now(args))

    return run

