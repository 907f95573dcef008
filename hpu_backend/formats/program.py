"""The Program: everything a Dynamo graph compiles to, stored so that a later process skips AOTAutograd.

A program holds the AOTAutograd graphs of one Dynamo graph as recipe templates (graph passes
done, symbolic, one per graph: ``inference``, or ``forward`` + ``backward``), the bucket-independent
key parts of each (so every bucket's recipe is found in the store without tracing), the guards the
trace added over the Dynamo graph's shape symbols, and the **contract**: what AOTAutograd's runtime
wrappers do around the graphs (which outputs are saved for backward, which are differentiable,
which inputs are mutated). Like a recipe it is plain msgpack data, checked on load; no code.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import msgpack

from . import symexpr
from .recipe import Recipe, RecipeFormatError, unpack, versioned

PROGRAM_VERSION = 2

# "restart": AOTAutograd asked Dynamo to trace again with some float inputs specialized
# (``specialize`` names them); a hit replays that request instead of tracing to find out. Once the second trace's
# program is stored, the restart names it (``target``) with the values the floats had (``floats``): a hit whose
# floats have those values serves that program at once, with those inputs left out.
MODES = {"inference": ["inference"], "training": ["forward", "backward"], "restart": []}
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d")


@dataclass
class ProgramGraph:
    """One AOTAutograd graph of the program."""

    template: Recipe  # after the graph passes; each bucket's recipe is lowered from it
    key_parts: dict[str, str]  # the bucket-independent parts of its recipes' keys
    key_detail: dict[str, Any]


@dataclass
class Contract:
    """AOTAutograd's runtime contract around the graphs, as plain indices (see runtime/autograd.py)."""

    num_inputs: int
    mutated_inputs: list[int] = field(default_factory=list)  # mutated in the graph: versions bumped
    disable_amp: bool = False  # autocast was on while tracing: the graphs carry it, the call turns it off
    # Training only. The forward returns [user outputs, saved tensors, saved tensors without a
    # version check, saved symints]; the backward takes [symints, saved tensors, tangents].
    num_outputs: int = 0
    saved: list[int] = field(default_factory=list)  # [start, stop) of the forward's outputs
    saved_unchecked: list[int] = field(default_factory=list)
    saved_symints: list[int] = field(default_factory=list)
    non_differentiable: list[int] = field(default_factory=list)  # output indices
    unsafe_view: list[int] = field(default_factory=list)  # outputs re-wrapped by aten._unsafe_view
    tangents: list[int] = field(default_factory=list)  # outputs whose gradients the backward takes
    tangent_layouts: list[Any] = field(default_factory=list)  # memory format name, or [size, stride]


@dataclass
class Program:
    """The compiled form of one Dynamo graph (for one set of input properties and settings)."""

    mode: str  # "inference" | "training" | "restart"
    graphs: list[ProgramGraph]
    contract: Contract
    symbols: list[str] = field(default_factory=list)  # the Dynamo graph's shape symbols, normalized
    symbol_sources: list[list[int]] = field(default_factory=list)  # [input index, dim] (-1: SymInt input)
    guards: list[Any] = field(default_factory=list)  # symexpr trees over ``symbols``
    specialize: list[str] = field(default_factory=list)  # "restart": Dynamo's names of the floats
    target: str = ""  # "restart": the key of the program traced with them specialized, if known
    floats: list[list[Any]] = field(default_factory=list)  # "restart": [input index, float.hex()] per float
    program: int = PROGRAM_VERSION

    def to_bytes(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Program":
        return versioned(cls, unpack(data), "program", PROGRAM_VERSION, "program", "program")

    def check(self, where: str = "program") -> None:
        for i, g in enumerate(self.graphs):
            g.template.check(f"{where}.graphs[{i}].template")
        _check(self)

    def graph(self, kind: str) -> ProgramGraph:
        return next(g for g in self.graphs if g.template.kind == kind)


def parse_payload(data: bytes) -> Recipe | Program:
    """A cache entry's payload, fully checked: a program (it has a ``program`` field) or a recipe."""
    raw = unpack(data)
    if isinstance(raw, dict) and "program" in raw:
        return Program.from_bytes(data)
    return Recipe.from_plain(raw)


def _check(p: Program) -> None:
    """Cross-field checks, so that every index the runtime uses is in range."""
    kinds = [g.template.kind for g in p.graphs]
    if MODES.get(p.mode) != kinds:
        raise RecipeFormatError(f"program.mode {p.mode!r} with graphs {kinds}")
    if p.mode == "restart":
        if not all(_SPECIALIZED.fullmatch(name) for name in p.specialize):
            raise RecipeFormatError(f"program.specialize: {p.specialize!r:.80}")
        _check_link(p)
        return
    if p.target or p.floats:
        raise RecipeFormatError(f"program.mode {p.mode!r} with a restart's target or floats")
    c, n = p.contract, p.contract.num_inputs
    fw = p.graphs[0].template
    if n != len(fw.inputs) or n < 0:
        raise RecipeFormatError(f"program.contract.num_inputs {n} but the graph takes {len(fw.inputs)}")
    if len(p.symbols) != len(p.symbol_sources):
        raise RecipeFormatError("program.symbols and program.symbol_sources differ in length")
    for i, d in p.symbol_sources:
        _index(i, n, "symbol_sources")
    _indices(c.mutated_inputs, n, "mutated_inputs")
    _check_writes(p)
    if p.mode == "training":
        _check_training(c, len(fw.outputs), len(p.graphs[1].template.inputs))
    try:
        for tree in p.guards:
            symexpr.validate(tree)
    except symexpr.SymExprError as e:
        raise RecipeFormatError(f"program.guards: {e}") from None
    _check_guards_evaluate(p)


def _check_writes(p: Program) -> None:
    """The forward (or inference) graph declares writes only into inputs the contract says it mutates (their
    versions are bumped for autograd); a backward writes none of its inputs (saved values, gradients)."""
    fw = p.graphs[0].template
    allowed = {fw.input_names[i] for i in p.contract.mutated_inputs}
    if set(fw.writes) - allowed:
        raise RecipeFormatError(f"program: the graph writes {sorted(set(fw.writes) - allowed)!r:.80}, which "
                                "its contract does not list as mutated inputs")
    if any(g.template.writes for g in p.graphs[1:]):
        raise RecipeFormatError("program: the backward graph declares writes into its inputs")


GUARD_PROBE = 1009  # a size no real guard divides by zero at (a prime, far from 0, 1 and small strides)


def _check_guards_evaluate(p: Program) -> None:
    """Guards name only the program's symbols and evaluate (to anything) at one probe size: a guard that
    divides by zero or names an unbound symbol is refused when the entry is read, not when it is served."""
    unbound = set().union(*(symexpr.symbols(t) for t in p.guards)) - set(p.symbols) if p.guards else set()
    if unbound:
        raise RecipeFormatError(f"program.guards name unbound symbols {sorted(unbound)!r:.80}")
    env = dict.fromkeys(p.symbols, GUARD_PROBE)
    for tree in p.guards:
        try:
            symexpr.evaluate(tree, env)
        except (symexpr.SymExprError, ArithmeticError, TypeError, ValueError) as e:
            raise RecipeFormatError(f"program.guards: {symexpr.to_str(tree):.80} cannot be evaluated "
                                    f"({type(e).__name__}: {e})") from None


_SPECIALIZED = re.compile(r"[a-z][a-z0-9_]{0,31}")
_KEY = re.compile(r"[0-9a-f]{32}")


def _check_link(p: Program) -> None:
    """A restart's target is a program key, given with one value per float input it leaves out (and only so)."""
    if bool(p.target) != bool(p.floats) or (p.target and not _KEY.fullmatch(p.target)):
        raise RecipeFormatError(f"program.target {p.target!r:.40} with {len(p.floats)} floats")
    seen = set()
    for item in p.floats:
        if (len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] < 1 << 16 or item[0] in seen
                or type(item[1]) is not str):
            raise RecipeFormatError(f"program.floats: {item!r:.60}")
        try:
            float.fromhex(item[1])
        except ValueError:
            raise RecipeFormatError(f"program.floats: {item[1]!r:.40} is not a float") from None
        seen.add(item[0])


def _check_training(c: Contract, fw_outputs: int, bw_inputs: int) -> None:
    spans = [[0, c.num_outputs], c.saved, c.saved_unchecked, c.saved_symints]
    at = 0
    for span in spans:
        if len(span) != 2 or span[0] != at or not span[0] <= span[1]:
            raise RecipeFormatError(f"program.contract: forward output spans {spans} do not tile the outputs")
        at = span[1]
    if at != fw_outputs:
        raise RecipeFormatError(f"program.contract: spans cover {at} of {fw_outputs} forward outputs")
    for name in ("non_differentiable", "unsafe_view", "tangents"):
        _indices(getattr(c, name), c.num_outputs, name)
    if len(c.tangent_layouts) != len(c.tangents):
        raise RecipeFormatError("program.contract: one tangent layout per tangent expected")
    for layout in c.tangent_layouts:
        ok = layout in MEMORY_FORMATS or (
            isinstance(layout, list) and len(layout) == 2 and all(
                isinstance(v, list) and all(type(x) is int and x >= 0 for x in v) for v in layout))
        if not ok:
            raise RecipeFormatError(f"program.contract: bad tangent layout {layout!r:.60}")
    if (fw_outputs - c.num_outputs) + len(c.tangents) != bw_inputs:
        raise RecipeFormatError("program.contract: the backward's inputs are not saved values + tangents")


def _indices(values: list[int], n: int, where: str) -> None:
    for v in values:
        _index(v, n, where)


def _index(v: Any, n: int, where: str) -> None:
    if type(v) is not int or not 0 <= v < n:
        raise RecipeFormatError(f"program.contract.{where}: index {v!r:.20} out of range 0..{n - 1}")
