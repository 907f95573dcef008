"""Why Dynamo recompiled a frame: the guard that failed, the value that broke it, the user's line.

Dynamo records the first failed guard of a recompilation in its compile metrics, and the frame being
compiled is its current instruction translator's; both are read here while the backend runs. They are
torch internals: when they cannot be read (another torch version), the reason is ``None`` and the
recompile is labelled "guard failure" as before, never an error.

Each recompile is classified (``CAUSES``), counted per function, and reported three ways: in
``hpu_backend.metrics`` (``graph_compilation``'s ``RecompileCauses`` and ``metrics.recompiles()``), by
one warning when a function passes ``recompile_warn`` recompiles, and by one warning when it is the loop
constant pattern of the Gaudi docs: a Python number that takes a new value on every call (a loop index
such as ``steps[i]``) is a constant of each graph, so every call compiles a new graph.
"""

from __future__ import annotations

import dis
import logging
import re
import sys
import threading
import weakref
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from .. import metrics
from .sources import library_file

log = logging.getLogger(__name__)

CAUSES = ("input shape", "constant", "module attribute", "dtype", "requires_grad", "grad mode", "global state",
          "other")

LOOP_CONSTANT_FIX = (
    "keep the values in a tensor made once before the loop (steps = torch.tensor(steps)) and pass steps[i] "
    "to the model as a tensor, so that the value is data of one graph rather than a constant of a new one "
    "(Intel Gaudi docs, dynamic shapes: loop constants)")


@dataclass(frozen=True)
class Recompile:
    """One recompilation, as ``metrics.recompiles()`` and ``hpurecipe analyze`` report it."""

    function: str  # "forward (model.py:10)"
    guard: str  # the failed guard as Dynamo prints it: "i == 2", "tensor 'x' size mismatch at index 0 ..."
    cause: str  # one of CAUSES
    variable: str  # "i", "x", "self.k"; "" when the guard names none
    change: str  # "2 -> 3", "dim 0: 4 -> 8", "Float -> Double"; "" when unknown
    source: str  # the user's line that reads the variable: "model.py:12"; else the function's line
    library: str = ""  # the function's file when it is library code ("transformers/utils/generic.py"), else ""

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        what = f"{self.variable} {self.change}".strip() or self.guard
        return f"{self.function} recompiled: {self.cause} changed ({what}) at {self.source}"


_SIZE = re.compile(r"tensor '(?P<var>[^']+)' (?:size|stride) mismatch at index (?P<dim>\d+)\. "
                   r"expected (?P<old>\d+), actual (?P<new>\d+)")
_DTYPE = re.compile(r"tensor '(?P<var>[^']+)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)")
_GRAD = re.compile(r"tensor '(?P<var>[^']+)' requires_grad mismatch")
# A size-range guard: "2 <= x.size()[0] <= 15", "x.size()[0] <= 15", "2 <= L['x'].size()[1]" (Dynamo's 0/1
# specialization gives the lower bound 2; a kernel choice inside torch, such as the convolution backend, may add
# an upper one).
_RANGE = re.compile(r"^(?:(?P<lo>\d+) <=? )?(?P<var>[A-Za-z_][\w.]*(?:\[[^\]]+\])*)\.size\(\)\[(?P<dim>\d+)\]"
                    r"(?: <=? (?P<hi>\d+))?$")
_EQ = re.compile(r"^(?P<var>[A-Za-z_][\w.]*(?:\[[^\]]+\])?) == (?P<old>[^\s#]+)")
_USER_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def explain() -> Recompile | None:
    """The recompilation Dynamo is compiling now, or None when torch does not say (or it is none)."""
    try:
        text, code, f_locals = _dynamo_state()
    except Exception:  # noqa: BLE001 - torch internals moved: no reason, never a failed compile
        return None
    if not isinstance(text, str) or not text:
        return None
    return classify(text, code, f_locals)


def _dynamo_state():
    """Dynamo's recompile reason, and the code object and locals of the frame it compiles (internals)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    from torch._dynamo.utils import get_metrics_context

    tx = InstructionTranslator.current_tx()
    return get_metrics_context()._metrics.get("recompile_reason"), tx.f_code, tx.f_locals


def classify(text: str, code, f_locals: dict) -> Recompile:
    """A ``Recompile`` from Dynamo's reason text and the frame's code object and locals."""
    code = _user_code(code, f_locals)
    first = text.split("\n", 1)[0]
    guard = re.sub(r"^\d+/\d+: ", "", first).split("  #", 1)[0].strip()
    function = f"{code.co_name} ({_short(code.co_filename)}:{code.co_firstlineno})"
    cause, var, change = "other", "", ""
    if m := _SIZE.search(guard):
        cause, var, change = "input shape", m["var"], f"dim {m['dim']}: {m['old']} -> {m['new']}"
    elif m := _DTYPE.search(guard):
        cause, var, change = "dtype", m["var"], f"{m['old']} -> {m['new']}"
    elif (m := _RANGE.match(guard)) and (m["lo"] or m["hi"]):
        cause, var = "input shape", re.sub(r"^L\['(\w+)'\]$", r"\1", m["var"])
        size = _size(var, int(m["dim"]), f_locals)
        change = f"dim {m['dim']}: {m['lo'] or ''}..{m['hi'] or ''} -> {'?' if size is None else size}"
    elif m := _GRAD.search(guard):
        cause, var = "requires_grad", m["var"]
    elif "GLOBAL_STATE changed" in guard:
        cause = "grad mode" if "grad_mode" in guard else "global state"
    elif m := _EQ.match(guard):
        var = m["var"]
        value = _value(var, f_locals)
        cause = "module attribute" if "." in var and _is_module(var.split(".")[0], f_locals) else "constant"
        change = f"{m['old']} -> {value}" if value is not _UNKNOWN else ""
    return Recompile(function, guard, cause, var, change, _source(text, code, var), library_file(code.co_filename))


# The callables torch.compile has wrapped so far, each with the compile that first met it (see another_callable).
_WRAPPED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def another_callable(compile_id) -> bool:
    """Whether this compile is the first of a callable that torch.compile wraps: every compiled module is called
    through one wrapper function of Dynamo's (``external_utils.inner``), so the second module a process
    compiles is a recompile of that shared frame to Dynamo, whatever guard it names first (the wrapped
    callable, the backend, the torch function mode stack), but a new graph to the user. False when the frame
    is not that wrapper or torch's internals cannot be read."""
    try:
        _, code, f_locals = _dynamo_state()
        fn = f_locals.get("fn") if code.co_filename.endswith(("_dynamo/external_utils.py",
                                                               "_dynamo\\external_utils.py")) else None
        first = _WRAPPED.setdefault(fn, compile_id) if fn is not None else None
    except Exception:  # noqa: BLE001 - torch internals moved, or a callable with no weak reference
        return False
    return first is not None and first == compile_id


def _user_code(code, f_locals: dict):
    """The code a recompile is about: for Dynamo's shared wrapper frame (``external_utils.inner``, through which
    torch.compile calls a module or function), the wrapped module's ``forward`` or the function itself."""
    if library_file(code.co_filename) != "torch/_dynamo/external_utils.py" or "fn" not in f_locals:
        return code
    target = getattr(f_locals["fn"], "forward", f_locals["fn"])
    return getattr(getattr(target, "__func__", target), "__code__", code)


_UNKNOWN = object()


def _value(path: str, f_locals: dict):
    """The current value of a plain guard source (``i``, ``self.k``), or _UNKNOWN; never evaluates code."""
    if "[" in path:
        return _UNKNOWN
    head, *attrs = path.split(".")
    if head not in f_locals:
        return _UNKNOWN
    value = f_locals[head]
    for a in attrs:
        try:
            value = object.__getattribute__(value, "__dict__")[a]
        except (AttributeError, KeyError, TypeError):
            return _UNKNOWN
    return value if isinstance(value, (bool, int, float, str)) else _UNKNOWN


def _size(path: str, dim: int, f_locals: dict) -> int | None:
    """The size now of dimension ``dim`` of the tensor a guard names (``x``, ``args[0]``, ``L['x']``), or None;
    only names and integer or string subscripts are followed, never code."""
    import torch

    head, *keys = re.findall(r"[A-Za-z_]\w*|\[(?:\d+|'[^']*')\]", path)
    value = f_locals.get(head, _UNKNOWN) if head != "L" else f_locals
    for key in keys:
        key = key[1:-1]
        try:
            value = value[int(key)] if key.isdigit() else value[key.strip("'")]
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(value, torch.Tensor) and 0 <= dim < value.dim():
        return int(value.shape[dim])
    return None


def _is_module(name: str, f_locals: dict) -> bool:
    import torch

    return isinstance(f_locals.get(name), torch.nn.Module)


def _source(text: str, code, var: str) -> str:
    """Where the user's code reads ``var``: the innermost of the user's own frames in Dynamo's user stack, else the
    first line of ``code`` that loads the name, else the function's first line. Frames of library code (torch's
    ``_pytree.py``, this simulator's ``dispatch.py``) are never the user's line: when the code compiled is
    library code, the line is the innermost user frame calling it now."""
    frames = _USER_LINE.findall(text)
    mine = [(file, line) for file, line in frames if not library_file(file)]
    if mine:
        file, line = mine[-1]
        return f"{_short(file)}:{line}"
    if library_file(code.co_filename):
        caller = _calling_user_line()
        if caller:
            return caller
    if frames:
        file, line = frames[-1]
        return f"{_short(file)}:{line}"
    name = var.split(".")[0].split("[")[0]
    for ins in dis.get_instructions(code):
        if ins.argval == name and ins.opname.startswith("LOAD") and ins.positions and ins.positions.lineno:
            return f"{_short(code.co_filename)}:{ins.positions.lineno}"
    return f"{_short(code.co_filename)}:{code.co_firstlineno}"


def _calling_user_line() -> str:
    """The innermost frame of the user's own code on the stack now ("train.py:41"), or "" when there is none."""
    frame = sys._getframe(1)
    while frame is not None:
        if not library_file(frame.f_code.co_filename) and not frame.f_code.co_filename.startswith("<"):
            return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


class Tracker:
    """Recompiles per function: the excessive-recompile warning and the loop-constant warning, once each."""

    def __init__(self):
        self._lock = threading.Lock()
        self._causes: dict[str, Counter] = defaultdict(Counter)
        self._values: dict[tuple[str, str], set] = defaultdict(set)
        self._warned: set = set()

    def record(self, rec: Recompile, limit: int) -> None:
        with self._lock:
            causes = self._causes[rec.function]
            causes[rec.cause] += 1
            warn_excessive = sum(causes.values()) > limit and self._once(("excessive", rec.function))
            loop = rec.cause in ("constant", "module attribute") and rec.change
            if loop:
                seen = self._values[rec.function, rec.variable]
                seen.update(rec.change.split(" -> "))
                loop = len(seen) >= 3 and self._once(("loop", rec.function, rec.variable))
            counted = ", ".join(f"{c}: {n}" for c, n in causes.most_common())
        if warn_excessive:
            log.warning("hpu_backend: %s recompiled %d times (%s); each recompile lowers new recipes. "
                        "Last: %s", rec.function, sum(causes.values()), counted, rec.line())
        if loop:
            log.warning("hpu_backend: %s compiles a new graph for every value of %s (%s at %s): the loop "
                        "constant pattern. Fix: %s", rec.function, rec.variable, ", ".join(sorted(seen)),
                        rec.source, LOOP_CONSTANT_FIX)

    def _once(self, key) -> bool:
        if key in self._warned:
            return False
        self._warned.add(key)
        return True


TRACKER = Tracker()


def note(rec: Recompile | None, limit: int) -> None:
    """Count ``rec`` in the metrics and the per-function warnings (nothing for an unknown reason)."""
    if rec is None:
        return
    metrics.record_recompile(rec.to_dict())
    TRACKER.record(rec, limit)
