"""Model files: load a plain Python file (``model.py`` or ``model.py:attr``) and check it holds a warm-up spec.

A model file defines ``make_model()`` (returns the module), ``make_inputs(**axes)`` (a tuple of example
inputs for one shape; given ``seed=`` too when it takes one) and ``AXES = {axis: [values]}`` (the shapes to
cover; one recipe set per point of their cartesian product). Optional: ``COMPILE = {"dynamic": ...,
"options": {...}}`` (the ``torch.compile`` arguments; default ``{}``), ``MODEL_INPUTS`` (how many leading
inputs feed the model; the default is all of them), ``loss(output, *inputs)`` (needed to warm training
graphs), ``AXES_MIN = {axis: size}`` (the smallest size a package serves on an axis, for models that cannot
take smaller ones, such as strided convolutions), ``DECODE`` (a generative model's decode step: a holder of
the same names, missing ones taken from the file), ``LAYERS`` (the number of identical decoder layers),
``LAYER_PERIOD`` (when the layers repeat in groups, the group's size: LAYERS counts layers, the plans extrapolate
over groups),
``CONTEXT`` (the most tokens a sequence may hold: plans for longer ones are refused before any tracing) and
``PER_CARD(cards, group, layers)`` (a holder of one card's tensor-parallel shard, its collectives over the
process group ``group``, with ``layers`` layers). With ``path.py:attr``, ``attr`` names an object, class, namespace or
dict in the file holding those names.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from pathlib import Path

from .hfmodels import is_config, load_config
from .modelspec import ModelFileError, ModelSpec, _Expired, _raised, spec_from


def load_model_file(selector: str | Path) -> ModelSpec:
    """Import ``path.py`` (or ``path.py:attr``) and return its checked ModelSpec; a Hugging Face ``config.json``
    (or a directory holding one) is read as data instead (``hfmodels``: nothing is imported from it)."""
    if is_config(selector):
        return load_config(selector)
    path, _, attr = str(selector).partition(":") if not Path(str(selector)).exists() else (str(selector), "", "")
    if not attr:
        _refuse_a_script(Path(path))
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


def _refuse_a_script(path: Path) -> None:
    """ModelFileError, before anything is imported, for a script (a Gaudi training script, say) rather than a model
    file: importing it would run it, and its ``habana_frameworks`` imports resolve only under the launcher. The
    launcher is what reads a script: ``hpurecipe run`` reports what it ran, ``perf-tool`` advises on its trace."""
    names = _top_level_names(path)
    if names is None or "make_model" in names:
        return
    gaudi = " and imports habana_frameworks" if "habana_frameworks" in names else ""
    raise ModelFileError(
        f"{path}: a script, not a model file (it defines no make_model{gaudi}): run it with `hpurecipe run --trace "
        f"t.json {path} ARGS` for the report of what it ran (CPU fallbacks, recompiles, host syncs with their lines), "
        f"then `hpurecipe perf-tool --trace t.json` for advice; or give a model file (make_model, make_inputs, AXES)")


def _top_level_names(path: Path) -> set[str] | None:
    """The names a file binds at its top level, plus the top package of each import; None when that cannot be
    told without running it (unreadable, a syntax error, ``import *``): then the import says what is wrong."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in _module_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            names.update(a.name.split(".")[0] for a in node.names if isinstance(node, ast.Import))
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _module_level(tree: ast.Module):
    """The statements run at import: the module's, and those inside its top-level if/try/with blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]


def _stem_label(path: str) -> str:
    return Path(path).stem


def _hash(path: Path) -> str:
    try:
        return hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()
    except OSError:
        return ""
