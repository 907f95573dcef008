"""The checked spec of a model file: the names it defines (``ModelSpec``), their checks, and the guarded calls
into the user's code (errors as one line naming the file, a time limit). ``modelfile.py`` finds and imports the
file (or reads a Hugging Face config through ``hfmodels.py``) and hands its names here."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import re
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import one_line
from ..buckets import BucketError
from ..settings import Settings, SettingsError
from ..errors import HpuBackendError

REQUIRED = {
    "make_model": "a function returning the nn.Module",
    "make_inputs": "a function (**axes) returning a tuple of example inputs for one shape",
    "AXES": 'the shape axes and the values to cover, e.g. AXES = {"batch": [1, 8]}',
}
OPTIONAL = {"COMPILE": {}}  # the names a model file may leave out, with the value it then has
COMPILE_KEYS = ("dynamic", "options")


class ModelFileError(HpuBackendError, ValueError):
    """A model file that cannot be loaded or lacks part of the spec (one line naming what is wrong)."""


class _Expired(BaseException):
    """``time_limit`` ran out (a BaseException, so that no ``except Exception`` in the model or in torch
    swallows it on its way out)."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model file says: how to build the model and its inputs, which shapes, which compile arguments."""

    name: str  # label stored with cache entries (COMPILE options' "model", else the file's stem)
    path: str  # the selector it was loaded from ("models/gpt.py" or "models/gpt.py:SPEC")
    make_model: Callable[[], Any]
    make_inputs: Callable[..., tuple]
    axes: dict[str, list[int]]
    dynamic: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    model_inputs: int | None = None
    loss: Callable[..., Any] | None = None
    source_hash: str = ""
    decode: "ModelSpec | None" = None  # a generative model's decode step (this spec being its prefill step)
    per_card: Callable[..., Any] | None = None  # PER_CARD(cards=, group=, layers=): one card's shard
    layers: int | None = None  # LAYERS: identical decoder layers (capacity across cards extrapolates over them)
    axes_min: dict[str, int] = field(default_factory=dict)  # AXES_MIN: an axis's smallest packaged size
    seeded: bool = True  # make_inputs takes seed=
    context: int | None = None  # CONTEXT: the most tokens a sequence may hold (prompt and generated)
    # LAYER_PERIOD: the layers repeat in groups of this many (Llama 4: a dense layer, then a mixture of experts);
    # capacity across cards extrapolates over groups
    layer_period: int = 1

    def points(self) -> list[dict[str, int]]:
        """Every shape to cover: the cartesian product of the axes, in file order."""
        names = list(self.axes)
        return [dict(zip(names, values)) for values in itertools.product(*self.axes.values())]

    def with_axes(self, overrides: Mapping[str, list[int]]) -> "ModelSpec":
        """The same spec covering other values on some axes (ModelFileError for an unknown axis)."""
        unknown = sorted(set(overrides) - set(self.axes))
        if unknown:
            raise ModelFileError(f"{self.path}: no axis {', '.join(unknown)}; its axes are {', '.join(self.axes)}")
        axes = {name: list(overrides.get(name, values)) for name, values in self.axes.items()}
        return ModelSpec(**{**self.__dict__, "axes": axes})

    def split(self, inputs: tuple) -> tuple:
        """The inputs that feed the model."""
        return inputs if self.model_inputs is None else inputs[:self.model_inputs]

    # The file's own code, called so that its failures and wrong results are one-line ModelFileErrors.

    def build_model(self) -> Any:
        """``make_model()``: the module."""
        model = user_call(self.path, "make_model()", self.make_model)
        if not callable(model) or not hasattr(model, "train"):
            raise ModelFileError(f"{self.path}: make_model() must return an nn.Module, got {type(model).__name__}")
        return model

    def inputs(self, point: Mapping[str, int], seed: int = 0) -> tuple:
        """``make_inputs(**point, seed=seed)``: the example inputs for one shape (no seed when it takes none)."""
        seeded = {"seed": seed} if self.seeded else {}
        inputs = user_call(self.path, f"make_inputs({point_label(point)})", self.make_inputs, **point, **seeded)
        if not isinstance(inputs, (tuple, list)):
            raise ModelFileError(f"{self.path}: make_inputs must return a tuple of inputs, got "
                                 f"{type(inputs).__name__}; for a single input return (x,)")
        return tuple(inputs)

    def require_loss(self) -> None:
        if self.loss is None:
            raise ModelFileError(f"{self.path}: training needs a loss(output, *inputs) function in the model file")

    def loss_of(self, output: Any, inputs: tuple) -> Any:
        """``loss(output, *inputs)``: the training loss."""
        self.require_loss()
        return user_call(self.path, "loss()", self.loss, output, *inputs)


def point_label(point: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def user_call(where: str, what: str, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` from a model file; any exception becomes "WHERE: WHAT raised TYPE: MESSAGE"
    (``sys.exit()`` and exceptions outside the Exception hierarchy too; Ctrl-C still interrupts)."""
    try:
        return fn(*args, **kwargs)
    except (ModelFileError, KeyboardInterrupt, _Expired):
        raise
    except BaseException as e:  # the user's code: anything may come out of it
        # chained: HPURECIPE_TRACEBACK=1 shows where in the model file it failed
        raise ModelFileError(f"{where}: {what} {_raised(e)}") from e


def model_call(where: str, what: str, model: Callable, *args, eager: Callable | None = None) -> Any:
    """``model(*args)`` for a compiled or traced model, as ``user_call``, with torch's fake-tensor log kept
    quiet. When it fails and the model fails run eagerly on the same inputs too, the eager error is raised
    instead: the model's own cause with real sizes ("(1x3 and 2x2)"), not the tracer's wrapper or symbols.
    ``eager`` is the model itself when ``model`` is not a torch.compile'd module."""
    try:
        with quiet_trace_logs():
            return user_call(where, what, model, *args)
    except ModelFileError:
        check_eager(where, what, eager or getattr(model, "_orig_mod", model), *args)
        raise


def check_eager(where: str, what: str, model: Callable, *args) -> None:
    """ModelFileError "WHERE: WHAT raised TYPE: MESSAGE (run eagerly too, ...)" when ``model``
    fails on ``args`` without any compiler or tracer; nothing when it runs."""
    import torch

    try:
        with torch.no_grad():
            model(*args)
    except (KeyboardInterrupt, _Expired):
        raise
    except BaseException as e:  # the user's code: anything may come out of it
        raise ModelFileError(f"{where}: {what} {_raised(e)} (run eagerly too, without compiling: fix the model "
                             f"or make_inputs)") from e


@contextlib.contextmanager
def quiet_trace_logs():
    """Torch logs a traceback at ERROR for every op that fails on fake tensors while tracing; the failure
    reaches the caller as an exception too, which is reported in one line, so the log is noise."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _raised(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r}); model code must return, not exit"
    return f"raised {one_line(e)}"


@contextlib.contextmanager
def time_limit(seconds: float | None, where: str):
    """Bound the model code run inside: ModelFileError once ``seconds`` have passed (None or 0: no bound).

    An interval timer (SIGALRM) interrupts Python code between bytecodes; one long native call (a huge
    matmul) ends before the error is raised. Only the main thread can take signals: elsewhere, unbounded.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired:
        raise ModelFileError(f"{where}: the model code ran longer than --timeout {seconds:g} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)



def spec_from(holder: Any, where: str, default_name: str = "", source_hash: str = "") -> ModelSpec:
    """A ModelSpec from a module, object, class, namespace or dict holding the model-file names."""
    get = _getter(holder)
    missing = [n for n in REQUIRED if get(n) is None]
    if missing:
        raise ModelFileError(f"{where}: missing " + "; ".join(f"{n} ({REQUIRED[n]})" for n in missing))
    axes = _check_axes(get("AXES"), where)
    compile_args = get("COMPILE")
    dynamic, options = _check_compile(OPTIONAL["COMPILE"] if compile_args is None else compile_args, where)
    for name in ("make_model", "make_inputs"):
        if not callable(get(name)):
            raise ModelFileError(f"{where}: {name} must be a function ({REQUIRED[name]})")
    seeded = _check_signature(get("make_inputs"), axes, where)
    model_inputs = get("MODEL_INPUTS")
    if model_inputs is not None and (not isinstance(model_inputs, int) or model_inputs < 1):
        raise ModelFileError(f"{where}: MODEL_INPUTS must be a positive integer, got {model_inputs!r}")
    name = str(options.get("model") or default_name or "model")
    decode = None if get("DECODE") is None else _decode_spec(get, where, name, source_hash)
    per_card, layers = get("PER_CARD"), get("LAYERS")
    if per_card is not None and not callable(per_card):
        raise ModelFileError(f"{where}: PER_CARD must be a function (cards, group, layers) returning a model file")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
        raise ModelFileError(f"{where}: LAYERS must be a positive integer, got {layers!r}")
    period = get("LAYER_PERIOD")
    if period is not None and (not isinstance(period, int) or isinstance(period, bool) or period < 1
                               or (layers is not None and layers % period)):
        raise ModelFileError(f"{where}: LAYER_PERIOD must be a positive integer that divides LAYERS, got {period!r}")
    context = get("CONTEXT")
    if context is not None and (not isinstance(context, int) or isinstance(context, bool) or context < 1):
        raise ModelFileError(f"{where}: CONTEXT must be a positive integer (tokens), got {context!r}")
    return ModelSpec(name, where, get("make_model"), get("make_inputs"), axes, dynamic, options, model_inputs,
                     get("loss"), source_hash, decode, per_card, layers,
                     _check_axes_min(get("AXES_MIN"), axes, where), seeded, context, period or 1)


def generative_steps(make_model: Callable, make_inputs: Callable, make_decode_inputs: Callable,
                     label: str) -> dict[str, Any]:
    """The model-file names of a generative model: its prefill step (batch, input_len) and its ``DECODE`` step
    (batch, kv_len), both dynamic, labelled ``label`` and ``label-decode`` (models/llama.py, Hugging Face
    configs)."""
    return {"make_model": make_model, "make_inputs": make_inputs,
            "AXES": {"batch": [2, 4], "input_len": [16, 32]},
            "COMPILE": {"dynamic": True, "options": {"buckets": "exp:16", "model": label}},
            "DECODE": {"make_inputs": make_decode_inputs, "AXES": {"batch": [2, 4], "kv_len": [16, 32]},
                       "COMPILE": {"dynamic": True, "options": {"buckets": "exp:16", "model": f"{label}-decode"}}}}


def _getter(holder: Any) -> Callable[..., Any]:
    """``get(name, default=None)`` over a dict or the attributes of any other holder."""
    return holder.get if isinstance(holder, Mapping) else (lambda n, d=None: getattr(holder, n, d))


def _decode_spec(get: Callable, where: str, name: str, source_hash: str) -> ModelSpec:
    """``DECODE``: the decode step's names over the file's (its own make_inputs and AXES, the rest inherited)."""
    own = _getter(get("DECODE"))
    names = [*REQUIRED, *OPTIONAL, "MODEL_INPUTS"]
    merged = {n: get(n) if (value := own(n)) is None else value for n in names}
    if own("make_inputs") is None or own("AXES") is None:
        raise ModelFileError(f"{where}: DECODE must define its own make_inputs and AXES (the decode step's inputs)")
    return spec_from(merged, f"{where}:DECODE", f"{name}-decode", source_hash)


def _check_axes(axes: Any, where: str) -> dict[str, list[int]]:
    ok = isinstance(axes, Mapping) and axes and all(
        isinstance(k, str) and isinstance(v, (list, tuple)) and v and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v) for k, v in axes.items())
    if not ok:
        raise ModelFileError(f"{where}: AXES must map axis names to non-empty lists of sizes, "
                             f'e.g. {{"batch": [1, 8]}}; got {axes!r}')
    return {k: list(v) for k, v in axes.items()}


def _check_axes_min(axes_min: Any, axes: dict, where: str) -> dict[str, int]:
    if axes_min is None:
        return {}
    ok = isinstance(axes_min, Mapping) and all(
        k in axes and isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= min(axes[k])
        for k, v in axes_min.items())
    if not ok:
        raise ModelFileError(f"{where}: AXES_MIN must map axes ({', '.join(axes)}) to a smallest size from 1 up to "
                             f"the axis's smallest value, e.g. {{\"{next(iter(axes))}\": 16}}; got {axes_min!r}")
    return dict(axes_min)


def _check_compile(compile_args: Any, where: str) -> tuple[Any, dict]:
    if not isinstance(compile_args, Mapping) or set(compile_args) - set(COMPILE_KEYS):
        raise ModelFileError(f"{where}: COMPILE must be a dict with keys {', '.join(COMPILE_KEYS)}; "
                             f"got {compile_args!r}")
    options = dict(compile_args.get("options") or {})
    try:
        _check_buckets(Settings.from_options(options, env={}).buckets)
    except (SettingsError, BucketError) as e:
        raise ModelFileError(f"{where}: COMPILE options: {e}") from None
    return compile_args.get("dynamic"), options


_SYMBOL = re.compile(r"s[0-9]+|\*")


def _check_buckets(setting: Any) -> None:
    """BucketError unless every policy of the ``buckets`` option names a shape symbol (s0, s1, ... or *); Settings
    has parsed the policies themselves."""
    pairs = [("*", setting)] if isinstance(setting, str) else setting
    for symbol, _ in pairs:
        if not _SYMBOL.fullmatch(symbol):
            raise BucketError(f"buckets: {symbol!r} is not a shape symbol; name s0, s1, ... or '*' for the rest")


def _check_signature(make_inputs: Callable, axes: dict, where: str) -> bool:
    """Whether ``make_inputs`` takes ``seed=`` (ModelFileError unless it takes every axis by keyword)."""
    try:
        sig = inspect.signature(make_inputs)
    except (TypeError, ValueError):
        return True  # a builtin or C function: trust it
    try:
        sig.bind(**{a: 1 for a in axes})
    except TypeError as e:
        raise ModelFileError(f"{where}: make_inputs must accept the axes ({', '.join(axes)}) as keyword "
                             f"arguments: {e}") from None
    try:
        sig.bind(**{a: 1 for a in axes}, seed=0)
    except TypeError:
        return False  # the file's inputs do not depend on a seed
    return True
