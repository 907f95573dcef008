"""Model files: load a plain Python file (``model.py`` or ``model.py:attr``) and check it holds a warm-up spec.

A model file defines ``make_model()`` (returns the module), ``make_inputs(**axes)`` (a tuple of example
inputs for one shape; given ``seed=`` too when it takes one) and ``AXES = {axis: [values]}`` (the shapes to
cover; one recipe set per point of their cartesian product). Optional: ``COMPILE = {"dynamic": ...,
"options": {...}}`` (the ``torch.compile`` arguments; default ``{}``), ``MODEL_INPUTS`` (how many leading
inputs feed the model; the default is all of them), ``loss(output, *inputs)`` (needed to warm training
graphs), ``AXES_MIN = {axis: size}`` (the smallest size a package serves on an axis, for models that cannot
take smaller ones, such as strided convolutions), ``DECODE`` (a generative model's decode step: a holder of
the same names, missing ones taken from the file), ``LAYERS`` (the number of identical decoder layers),
``CONTEXT`` (the most tokens a sequence may hold: plans for longer ones are refused before any tracing) and
``PER_CARD(cards, group, layers)`` (a holder of one card's tensor-parallel shard, its collectives over the
process group ``group``, with ``layers`` layers). With ``path.py:attr``, ``attr`` names an object, class, namespace or dict in the file holding those names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from .hfmodels import is_config, load_config
from .modelspec import _Expired, _raised
# The spec's names, where callers have always found them: a model file is loaded and described from here.
from .modelspec import (ModelFileError, ModelSpec, check_eager, generative_steps, model_call,  # noqa: F401
                        point_label, quiet_trace_logs, spec_from, time_limit, user_call)


def load_model_file(selector: str | Path) -> ModelSpec:
    """Import ``path.py`` (or ``path.py:attr``) and return its checked ModelSpec; a Hugging Face ``config.json``
    (or a directory holding one) is read as data instead (``hfmodels``: nothing is imported from it)."""
    if is_config(selector):
        return load_config(selector)
    path, _, attr = str(selector).partition(":") if not Path(str(selector)).exists() else (str(selector), "", "")
    module = _import(Path(path))
    holder = module
    if attr:
        if not hasattr(module, attr):
            raise ModelFileError(f"{path}: no attribute {attr!r} (from the selector {selector})")
        holder = getattr(module, attr)
    return spec_from(holder, str(selector), _stem_label(path), _hash(Path(path)))


def _import(path: Path):
    if path.suffix != ".py" or not path.is_file():
        raise ModelFileError(f"{path}: no such model file (expected a .py file, optionally path.py:attr)")
    name = f"hpurecipe_model_{_stem_label(str(path))}_{_hash(path)[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except (KeyboardInterrupt, _Expired):
        sys.modules.pop(name, None)
        raise
    except BaseException as e:  # the user's code: any error (or exit) means "this file does not load"
        sys.modules.pop(name, None)
        raise ModelFileError(f"{path}: failed to import: it {_raised(e)}") from None
    return module


def _stem_label(path: str) -> str:
    return Path(path).stem


def _hash(path: Path) -> str:
    try:
        return hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()
    except OSError:
        return ""
