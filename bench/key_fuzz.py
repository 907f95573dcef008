"""The key fuzzer: mutations of everything that can change a compiled result, each compiled from a cache filled
before the mutation and fresh in an empty cache, to prove the recipe and program keys neither too weak nor too
strong.

A mutation's verdict comes from what the two caches hold, canonicalized (graph names, source lines and compile
times left out): an entry of the fresh cache whose key the warm cache holds with other contents is a **wrong
hit** (the key ignores something the recipe depends on; goal 0); an entry of the fresh cache under a new key
whose contents the warm cache already holds is a **needless miss** (the key depends on something the recipe does
not). Outputs and input gradients of both compiles are compared with eager as well. Everything runs in this one
process: ``torch._dynamo.reset()`` and a new session per compile, ``dynamic=False``, tiny functions.

    python bench/key_fuzz.py [--mutations 1200] [--seed 0] [--out bench/results/key_fuzz.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and str(ROOT) not in sys.path:  # run from a checkout; a test imports the installed copy
    sys.path.insert(0, str(ROOT))

from hpu_backend.formats import keyparts  # noqa: E402
from hpu_backend.metrics import metric_localcontext  # noqa: E402
from hpu_backend.serve.session import Session  # noqa: E402
from hpu_backend.settings import Settings  # noqa: E402
from recipecache import CacheConfig, RecipeCache  # noqa: E402

RESULTS = ROOT / "bench" / "results"

# Why a kind of mutation misses although the recipe it builds is the same, when that miss is by design.
BY_DESIGN = {
    "toolchain.torch": "a recipe built by another torch is never used: its tracing and decompositions may differ "
                       "in ways one build cannot show",
    "toolchain.hpu_backend": "a recipe built by another hpu_backend is never used: its lowering may differ",
    "toolchain.recipe_format": "the format version names how the bytes are read; another version is never read",
    "state.autocast": "the program (Dynamo graph) is keyed before AOTAutograd traces it, so global state that may "
                      "change the trace is keyed whether or not it does; its recipes still hit (one trace, no "
                      "lowering), as in AOTAutogradCache",
    "state.grad_mode": "as state.autocast: grad mode picks AOTAutograd's inference or training trace, keyed before it "
                       "shows whether any input needs a gradient",
    "state.deterministic": "as state.autocast: keyed before the trace shows whether an op depends on it",
    "state.default_dtype": "as state.autocast: keyed before the trace shows whether a factory depends on it",
}


# Settings whose value is keyed whole although some graphs do not depend on it (by the mutation's detail).
SETTING_BY_DESIGN = {
    "place_on_cpu": "a program is keyed before AOTAutograd shows which aten ops its graph has, so it keys every "
                    "name; its recipes key only the names of their own ops, and hit",
    "dtype_policy": "dtype_policy=fp8 changes the storage of matmul operands, weights and KV cache only (plans, "
                    "execute=false); a graph without them builds the same recipe, but the setting is keyed whole "
                    "rather than per op",
}


def why_needless(kind: str, detail: str) -> str:
    """Why a needless miss of this kind is by design ("" when it is not: a key to fix)."""
    setting = detail.split("=", 1)[0]
    return BY_DESIGN.get(kind) or (SETTING_BY_DESIGN.get(setting, "") if kind == "settings" else "")


# -- what is compiled -----------------------------------------------------------------------------------------

UNARY = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "abs": torch.abs, "neg": torch.neg,
         "exp": torch.exp, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class Graph:
    """The function compiled: ``reduce(unary(x * scale + y) [+ const] [fp8 round trip] [custom op], dim)``."""

    unary: str = "relu"
    scale: float = 2.0
    dim: int = 0
    keepdim: bool = False
    const: tuple[float, ...] | None = None  # a constant tensor added (as long as the last dimension)
    fp8_scale: float | None = None  # quantize to fp8 e4m3 with this scale and back
    custom: bool = False  # the fuzzer's custom op applied last
    reduce: str = "sum"  # sum | mean | amax


@dataclass(frozen=True)
class Input:
    dtype: str = "float32"
    shape: tuple[int, ...] = (4, 3)
    layout: str = "contiguous"  # contiguous | transposed (a non-contiguous stride) | offset (storage offset)
    requires_grad: bool = False
    pinned: bool = False


@dataclass(frozen=True)
class State:
    grad: bool = True
    autocast: str | None = None  # the CPU autocast dtype, None: off
    deterministic: bool = False
    default_dtype: str = "float32"


@dataclass(frozen=True)
class Case:
    graph: Graph = Graph()
    inputs: tuple[Input, ...] = (Input(), Input())
    alias: bool = False  # the second input is the first (one tensor passed twice)
    state: State = State()
    options: tuple[tuple[str, Any], ...] = ()
    toolchain: tuple[tuple[str, str], ...] = ()  # part -> the version that toolchain() reports
    seed: int = 0  # the inputs' values
    backward: int = 2  # which backward the custom op has (its registered autograd formula)
    body: int = 2  # which kernel the custom op runs

    @property
    def trains(self) -> bool:
        return self.state.grad and any(i.requires_grad for i in self.inputs)


class CustomOp:
    """The fuzzer's custom op ``<namespace>::scale`` (a new namespace per run, so that runs in one process do not
    collide), whose kernel and registered backward a mutation replaces."""

    def __init__(self, namespace: str):
        self.name = f"{namespace}::scale"

        @torch.library.custom_op(self.name, mutates_args=())
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @scale.register_fake
        def _(x):
            return torch.empty_like(x)

        self.op = scale
        self.body = self.backward = None
        self.set(backward=2, body=2)

    def set(self, backward: int, body: int) -> None:
        if backward != self.backward:
            self.op.register_autograd(_BACKWARDS[backward])
            self.backward = backward
        if body != self.body:
            torch.library.register_kernel(self.name, "cpu", _BODIES[body])
            self.body = body

    def __call__(self, x):
        return self.op(x)


# Distinct code, not one function over a parameter: a changed formula is changed code, as in a user's edit.
def _backward_2(ctx, grad):
    return grad * 2


def _backward_3(ctx, grad):
    return grad * 3


def _backward_sign(ctx, grad):
    return grad.neg() * -2


def _body_2(x):
    return x * 2


def _body_3(x):
    return x * 3


_BACKWARDS = {2: _backward_2, 3: _backward_3, 4: _backward_sign}
_BODIES = {2: _body_2, 3: _body_3}


def make_fn(g: Graph, custom: CustomOp) -> Callable:
    unary, reduce = UNARY[g.unary], getattr(torch, g.reduce)

    def fn(x, y):
        h = unary(x * g.scale + y)
        if g.const is not None:
            h = h + h.new_tensor(g.const)
        if g.fp8_scale is not None:
            h = (h / g.fp8_scale).to(torch.float8_e4m3fn).to(h.dtype) * g.fp8_scale
        if g.custom:
            h = custom(h)
        return reduce(h, g.dim, keepdim=g.keepdim)
    return fn


def make_inputs(case: Case) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(case.seed)
    made = [_tensor(spec, gen) for spec in case.inputs]
    return [made[0], made[0]] if case.alias else made


def _tensor(spec: Input, gen: torch.Generator) -> torch.Tensor:
    shape = spec.shape
    if spec.layout == "transposed":
        t = torch.randn(tuple(reversed(shape)), generator=gen).t()
    elif spec.layout == "offset":
        t = torch.randn((shape[0] + 1, *shape[1:]), generator=gen)[1:]
    else:
        t = torch.randn(shape, generator=gen)
    t = t.to(DTYPES[spec.dtype])
    if spec.pinned:
        t = t.pin_memory()  # the simulated device's pinned host memory (a CPU build pins nothing itself)
    return t.requires_grad_(spec.requires_grad)


@contextlib.contextmanager
def state(s: State) -> Iterator[None]:
    deterministic, default = torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype()
    torch.use_deterministic_algorithms(s.deterministic)
    torch.set_default_dtype(DTYPES[s.default_dtype])
    try:
        with torch.set_grad_enabled(s.grad), torch.autocast("cpu", dtype=DTYPES[s.autocast or "bfloat16"],
                                                            enabled=s.autocast is not None):
            yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_default_dtype(default)


_PATCHED = {"torch": "torch_version", "hpu_backend": "__version__", "recipe_format": "FORMAT_VERSION"}


@contextlib.contextmanager
def toolchain(versions: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """``keyparts.toolchain()`` reporting other versions (what another install would report)."""
    saved = {name: getattr(keyparts, name) for name in _PATCHED.values()}
    for part, version in versions:
        setattr(keyparts, _PATCHED[part], (lambda v=version: v) if part == "torch" else version)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(keyparts, name, value)


# -- one compile, and what a cache holds -----------------------------------------------------------------------

@dataclass
class Outcome:
    values: list[torch.Tensor]  # outputs, then the inputs' gradients
    program_hits: int = 0
    program_misses: int = 0
    recipe_hits: int = 0
    recipe_misses: int = 0
    error: str = ""


def run_eager(case: Case, custom: CustomOp) -> Outcome:
    return _run(case, custom, lambda fn: fn)


def run_compiled(case: Case, custom: CustomOp, cache: Path) -> Outcome:
    torch._dynamo.reset()
    options = dict(case.options, cache_config=f"{cache},false,256")
    session = Session.open(Settings.from_options(options))

    def compile_(fn):
        return torch.compile(fn, backend="hpu_backend", dynamic=False, options=options)

    with toolchain(case.toolchain), session.use(), metric_localcontext("recipe_cache") as m:
        out = _run(case, custom, compile_)
    session.flush()
    stats = dict(m.stats())
    out.program_hits, out.program_misses = stats["ProgramHit"], stats["ProgramMiss"]
    out.recipe_hits, out.recipe_misses = stats["TotalHit"], stats["TotalMiss"]
    return out


def _run(case: Case, custom: CustomOp, wrap: Callable) -> Outcome:
    custom.set(case.backward, case.body)
    fn = wrap(make_fn(case.graph, custom))
    inputs = make_inputs(case)
    with state(case.state):
        out = fn(*inputs)
        grads = []
        if case.trains and out.requires_grad:
            leaves = [t for t in dict.fromkeys(inputs) if t.requires_grad]
            grads = list(torch.autograd.grad(out.float().sum(), leaves, allow_unused=True))
    return Outcome([out.detach()] + [g for g in grads if g is not None])


_NAME = re.compile(r"fx_graph_\d+")
# Diagnostics, and a program's record of its graphs' keys: what runs does not depend on them.
_UNSTABLE = ("source", "compile_time_s", "key_parts", "key_detail")


def canonical(data: bytes) -> str:
    """A digest of an entry's payload without graph names, source lines and compile times."""
    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in _UNSTABLE}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return _NAME.sub("fx_graph", v) if isinstance(v, str) else v
    tree = walk(msgpack.unpackb(data, raw=False, strict_map_key=False))
    return hashlib.blake2b(msgpack.packb(tree, use_bin_type=True), digest_size=12).hexdigest()


def entries(cache: Path) -> dict[str, tuple[str, str]]:
    """key -> (kind: program | recipe, canonical digest) of every entry in the cache directory."""
    disk = RecipeCache(CacheConfig.parse(f"{cache},false,256"))
    found = {}
    for info in disk.entries():
        entry = disk.peek(info.key)
        if entry is not None:
            found[info.key] = (entry.meta.get("kind") == "program" and "program" or "recipe", canonical(entry.payload))
    return found


# -- the verdict -------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    kind: str
    detail: str
    changed: bool  # the fresh compile built entries the warm cache does not hold
    wrong_hits: list[str] = field(default_factory=list)  # entry kinds whose key collided with other contents
    needless: list[str] = field(default_factory=list)  # entry kinds built again under a new key, unchanged
    served_hit: bool = False  # the warm compile took its program from the cache
    mismatch: str = ""  # a compiled result unlike eager (served or fresh)
    invalid: bool = False  # eager fails on the mutated case too (compiled must fail as well; nothing else judged)


def judge(kind: str, detail: str, mutated: Case, warm: dict, fresh: dict, served: Outcome, new: Outcome,
          eager: Outcome) -> Verdict:
    contents = {digest for _, digest in warm.values()}
    wrong = [k for key, (k, d) in fresh.items() if key in warm and warm[key][1] != d]
    needless = [k for key, (k, d) in fresh.items() if key not in warm and d in contents]
    changed = any(d not in contents for _, d in fresh.values())
    mismatch = ""
    if dict(mutated.options).get("execute", True):  # execute=false returns uninitialized outputs (a prebuild)
        mismatch = _compare("served", served, eager) or _compare("fresh", new, eager)
    return Verdict(kind, detail, changed, wrong, needless, served.program_hits > 0, mismatch, bool(eager.error))


def _compare(name: str, got: Outcome, want: Outcome) -> str:
    if got.error and want.error:  # an invalid mutation: eager and compiled agree that it fails
        return ""
    if got.error or want.error:
        return f"{name}: {got.error or want.error}"
    if len(got.values) != len(want.values):
        return f"{name}: {len(got.values)} values, eager {len(want.values)}"
    for i, (a, b) in enumerate(zip(got.values, want.values)):
        try:
            torch.testing.assert_close(a, b, equal_nan=True)
        except AssertionError as e:
            return f"{name} value {i}: {str(e).splitlines()[0]}"
    return ""


def trial(base: Case, kind: str, detail: str, mutated: Case, custom: CustomOp, warm_dir: Path, tmp: Path) -> Verdict:
    """Compile ``mutated`` from a copy of the warm cache of ``base`` and fresh; judge the two."""
    served_dir, fresh_dir = tmp / "served", tmp / "fresh"
    for d in (served_dir, fresh_dir):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(warm_dir, served_dir)
    served = _guarded(lambda: run_compiled(mutated, custom, served_dir))
    new = _guarded(lambda: run_compiled(mutated, custom, fresh_dir))
    eager = _guarded(lambda: run_eager(mutated, custom))
    return judge(kind, detail, mutated, entries(warm_dir), entries(fresh_dir), served, new, eager)


def _guarded(fn: Callable[[], Outcome]) -> Outcome:
    """A compile or eager run that raises is an outcome with its error (eager and compiled must agree on it)."""
    try:
        return fn()
    except (RuntimeError, TypeError, ValueError, torch._dynamo.exc.TorchDynamoException) as e:
        return Outcome([], error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])


# -- the mutations ---------------------------------------------------------------------------------------------

def _inputs(case: Case, i: int, **change) -> Case:
    specs = list(case.inputs)
    specs[i] = replace(specs[i], **change)
    return replace(case, inputs=tuple(specs))


def _both(case: Case, **change) -> Case:
    return replace(case, inputs=tuple(replace(s, **change) for s in case.inputs))


def _graph(case: Case, **change) -> Case:
    return replace(case, graph=replace(case.graph, **change))


def _state(case: Case, **change) -> Case:
    return replace(case, state=replace(case.state, **change))


def _option(case: Case, name: str, value: Any) -> Case:
    return replace(case, options=tuple(dict(case.options, **{name: value}).items()))


def _other(rng: random.Random, choices, current):
    return rng.choice([c for c in choices if c != current])


Mutator = Callable[[Case, random.Random], tuple[str, Case]]


def _m_op(c, rng):
    op = _other(rng, list(UNARY), c.graph.unary)
    return op, _graph(c, unary=op)


def _m_scale(c, rng):
    s = rng.choice([2.5, -1.0, 0.5, 3.0, 2.0 + 2 ** -20, 1e-3])
    return f"scale {s!r}", _graph(c, scale=s if s != c.graph.scale else s + 1)


def _m_dim(c, rng):
    return "dim and keepdim", _graph(c, dim=1 - c.graph.dim) if rng.random() < 0.5 else \
        _graph(c, keepdim=not c.graph.keepdim)


def _m_reduce(c, rng):
    r = _other(rng, ["sum", "mean", "amax"], c.graph.reduce)
    return r, _graph(c, reduce=r)


def _m_const(c, rng):
    n = c.inputs[0].shape[-1]
    values = tuple(round(rng.uniform(-2, 2), 3) for _ in range(n))
    if c.graph.const is not None and rng.random() < 0.5:  # one element, by the smallest step a float32 holds
        values = (c.graph.const[0] + 2 ** -18, *c.graph.const[1:])
    return f"constant {values}", _graph(c, const=values)


def _m_fp8(c, rng):
    s = rng.choice([0.5, 0.25, 0.125, 1.0, 0.0625, 0.75])
    return f"fp8 scale {s}", _graph(c, fp8_scale=s if s != c.graph.fp8_scale else s * 2)


def _m_custom_backward(c, rng):
    b = _other(rng, list(_BACKWARDS), c.backward)
    return f"backward {_BACKWARDS[b].__name__}", replace(c, backward=b)


def _m_custom_body(c, rng):
    b = _other(rng, list(_BODIES), c.body)
    return f"kernel {_BODIES[b].__name__}", replace(c, body=b)


def _m_dtype(c, rng):
    i = rng.randrange(2)
    d = _other(rng, list(DTYPES), c.inputs[i].dtype)
    return f"input {i} {d}", _inputs(c, i, dtype=d)


def _m_shape(c, rng):
    last = c.inputs[0].shape[-1] if c.graph.const is not None else rng.choice([1, 3, 6, 7])  # the constant's length
    shape = (rng.choice([2, 3, 4, 5, 8]), last)
    if shape == c.inputs[0].shape:
        shape = (shape[0] + 1, shape[1])
    return f"shape {shape}", _both(c, shape=shape)


def _m_broadcast(c, rng):
    return "input 1 broadcast over dim 0", _inputs(c, 1, shape=(1, c.inputs[1].shape[1]))


def _m_layout(c, rng):
    i, layout = rng.randrange(2), rng.choice(["transposed", "offset", "contiguous"])
    if layout == c.inputs[i].layout:
        layout = "transposed" if layout != "transposed" else "offset"
    return f"input {i} {layout}", _inputs(c, i, layout=layout)


def _m_pinned(c, rng):
    i = rng.randrange(2)
    return f"input {i} pinned {not c.inputs[i].pinned}", _inputs(c, i, pinned=not c.inputs[i].pinned)


def _m_requires_grad(c, rng):
    i = rng.randrange(2)
    return f"input {i} requires_grad {not c.inputs[i].requires_grad}", \
        _inputs(c, i, requires_grad=not c.inputs[i].requires_grad)


def _m_alias(c, rng):
    return f"aliased {not c.alias}", replace(c, alias=not c.alias)


def _m_values(c, rng):
    return "other input values", replace(c, seed=c.seed + 1 + rng.randrange(100))


def _m_grad_mode(c, rng):
    return f"grad {not c.state.grad}", _state(c, grad=not c.state.grad)


def _m_autocast(c, rng):
    a = _other(rng, [None, "bfloat16", "float16"], c.state.autocast)
    return f"autocast {a}", _state(c, autocast=a)


def _m_deterministic(c, rng):
    return f"deterministic {not c.state.deterministic}", _state(c, deterministic=not c.state.deterministic)


def _m_default_dtype(c, rng):
    d = _other(rng, ["float32", "float64"], c.state.default_dtype)
    return f"default dtype {d}", _state(c, default_dtype=d)


def _m_target(c, rng):
    t = "gaudi3" if dict(c.options).get("target", "gaudi2") == "gaudi2" else "gaudi2"
    return f"target {t}", _option(c, "target", t)


SETTING_VALUES = [  # every setting (but the cache's own): a value other than its default
    {"strict": True}, {"buckets": "exact"}, {"buckets": "lin:4:64"}, {"fusion": False},
    {"place_on_cpu": "aten::relu,aten::tanh,aten::sum"}, {"max_compound_op_size": 2}, {"recompile_warn": 9},
    {"model": "another-model"}, {"execute": False}, {"dtype_policy": "fp8", "execute": False},
]


def _m_setting(c, rng):
    change = rng.choice(SETTING_VALUES)
    return ",".join(f"{k}={v!r}" for k, v in change.items()), replace(
        c, options=tuple(dict(c.options, **change).items()))


def _m_toolchain(part: str, versions: list[str]) -> Mutator:
    def mutate(c, rng):
        v = rng.choice(versions)
        return f"{part} {v}", replace(c, toolchain=tuple(dict(c.toolchain, **{part: v}).items()))
    return mutate


MUTATORS: dict[str, Mutator] = {
    "graph.op": _m_op, "graph.argument": _m_scale, "graph.dim": _m_dim, "graph.reduction": _m_reduce,
    "graph.constant": _m_const, "graph.fp8_scale": _m_fp8, "graph.custom_backward": _m_custom_backward,
    "graph.custom_kernel": _m_custom_body,
    "inputs.dtype": _m_dtype, "inputs.shape": _m_shape, "inputs.broadcast": _m_broadcast,
    "inputs.stride_offset": _m_layout, "inputs.pinned": _m_pinned, "inputs.requires_grad": _m_requires_grad,
    "inputs.aliasing": _m_alias, "inputs.values": _m_values,
    "state.grad_mode": _m_grad_mode, "state.autocast": _m_autocast, "state.deterministic": _m_deterministic,
    "state.default_dtype": _m_default_dtype,
    "target": _m_target, "settings": _m_setting,
    "toolchain.torch": _m_toolchain("torch", ["2.13.1", "2.11.0", "2.14.0.dev20260101"]),
    "toolchain.hpu_backend": _m_toolchain("hpu_backend", ["0.0.1", "99.0"]),
    "toolchain.recipe_format": _m_toolchain("recipe_format", [0, 99]),
}


def bases() -> list[Case]:
    """The cases mutations start from: plain, with constants and fp8, with the custom op, training."""
    trains = (Input(requires_grad=True), Input())
    return [
        Case(),
        Case(graph=Graph(unary="tanh", const=(0.5, -1.0, 2.0), reduce="mean")),
        Case(graph=Graph(unary="gelu", fp8_scale=0.25, dim=1)),
        Case(graph=Graph(custom=True), inputs=trains),
        Case(graph=Graph(unary="sigmoid", scale=-1.0), inputs=trains),
        Case(graph=Graph(unary="silu", keepdim=True), options=(("target", "gaudi3"),)),
    ]


# -- the run -----------------------------------------------------------------------------------------------------

def plan(mutations: int, seed: int, kinds: list[str] | None = None) -> list[tuple[int, str, str, Case]]:
    """``mutations`` (base index, kind, detail, mutated case), the kinds taken in turn, each from a random base."""
    rng, kinds = random.Random(seed), kinds or list(MUTATORS)
    cases = bases()
    out = []
    for n in range(mutations):
        kind = kinds[n % len(kinds)]
        fits = [i for i, c in enumerate(cases) if c.graph.custom or not kind.startswith("graph.custom")]
        b = rng.choice(fits)  # a custom op's kernel or backward is mutated where the graph calls it
        detail, mutated = MUTATORS[kind](cases[b], rng)
        out.append((b, kind, detail, mutated))
    return out


def fuzz(mutations: int, seed: int = 0, kinds: list[str] | None = None, workdir: Path | None = None,
         progress: Callable[[int, Verdict], None] | None = None, part: tuple[int, int] = (0, 1)) -> list[Verdict]:
    """Run ``mutations`` mutations (those of ``part`` (i, n): every n-th from the i-th); the verdict of each."""
    import hpu_backend.device as device

    device.enable("eager")  # pinned host memory is the simulated device's (a CPU build of torch has none)
    custom = CustomOp(f"keyfuzz{seed}_{random.Random().randrange(1 << 30)}")
    with contextlib.ExitStack() as stack:
        tmp = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="keyfuzz-")))
        warm = {}
        verdicts = []
        for n, (b, kind, detail, mutated) in enumerate(plan(mutations, seed, kinds)):
            if n % part[1] != part[0]:
                continue
            if b not in warm:
                warm[b] = tmp / f"warm{b}"
                run_compiled(bases()[b], custom, warm[b])
            verdicts.append(trial(bases()[b], kind, detail, mutated, custom, warm[b], tmp))
            if progress:
                progress(n, verdicts[-1])
    return verdicts


def summary(verdicts: list[Verdict]) -> dict:
    by_kind: dict[str, Counter] = {}
    for v in verdicts:
        c = by_kind.setdefault(v.kind, Counter())
        c["mutations"] += 1
        c["changed"] += v.changed
        c["served_hit"] += v.served_hit
        c["wrong_hits"] += bool(v.wrong_hits)
        c["needless_program_misses"] += "program" in v.needless
        c["needless_recipe_misses"] += "recipe" in v.needless
        c["mismatches"] += bool(v.mismatch)
        c["invalid"] += v.invalid
    total = Counter()
    for c in by_kind.values():
        total.update(c)
    needless: dict[str, dict] = {}
    for v in verdicts:
        if v.needless:
            why = why_needless(v.kind, v.detail)
            row = needless.setdefault(f"{v.kind}: {v.detail.split('=')[0]}" if v.kind == "settings" else v.kind,
                                      {"mutations": 0, "program": 0, "recipe": 0, "why": why})
            row["mutations"] += 1
            row["program"] += "program" in v.needless
            row["recipe"] += "recipe" in v.needless
    return {"mutations": len(verdicts), "wrong_hits": total["wrong_hits"], "mismatches": total["mismatches"],
            "invalid": total["invalid"],
            "needless_misses": sum(1 for v in verdicts if v.needless),
            "unexplained_needless": sum(1 for v in verdicts if v.needless and not why_needless(v.kind, v.detail)),
            "needless_by_kind": needless,
            "by_kind": {k: dict(c) for k, c in sorted(by_kind.items())},
            "wrong": [dataclasses.asdict(v) for v in verdicts if v.wrong_hits][:50],
            "mismatched": [dataclasses.asdict(v) for v in verdicts if v.mismatch][:50]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "key_fuzz.json")
    parser.add_argument("--part", default="0/1", help="I/N: run every N-th mutation from the I-th, into "
                        "OUT's .partI file (a busy machine runs a full run in parts); --merge N joins them")
    parser.add_argument("--merge", type=int, default=0, help="join the N parts' verdicts into OUT")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.out, args.merge)
    start = time.perf_counter()
    i, n = (int(x) for x in args.part.split("/"))

    def progress(n: int, v: Verdict) -> None:
        if v.wrong_hits or v.mismatch or (n + 1) % 100 == 0:
            print(f"[{n + 1}/{args.mutations}] {v.kind}: {v.detail} wrong={v.wrong_hits} needless={v.needless} "
                  f"{v.mismatch}", flush=True)
    verdicts = fuzz(args.mutations, args.seed, progress=progress, part=(i, n))
    seconds = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if n > 1:
        path = args.out.with_suffix(f".part{i}")
        path.write_text(json.dumps({"seed": args.seed, "seconds": seconds,
                                    "verdicts": [dataclasses.asdict(v) for v in verdicts]}) + "\n")
        print(f"{len(verdicts)} verdicts in {path}")
        return 0
    return write(args.out, verdicts, args.seed, seconds)


def write(out: Path, verdicts: list[Verdict], seed: int, seconds: float) -> int:
    result = {"bench": "key_fuzz", "seed": seed, "torch": torch.__version__, "seconds": seconds,
              **summary(verdicts)}
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: result[k] for k in ("mutations", "wrong_hits", "mismatches", "invalid", "needless_misses",
                                             "unexplained_needless")}))
    print("needless misses by kind:", {k: v["mutations"] for k, v in result["needless_by_kind"].items()})
    return 0


def merge(out: Path, parts: int) -> int:
    docs = [json.loads(out.with_suffix(f".part{i}").read_text()) for i in range(parts)]
    verdicts = [Verdict(**v) for d in docs for v in d["verdicts"]]
    return write(out, verdicts, docs[0]["seed"], round(sum(d["seconds"] for d in docs), 1))


if __name__ == "__main__":
    sys.exit(main())
