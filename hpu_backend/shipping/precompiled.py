"""Serving a precompiled directory (``hpurecipe precompile``): ``load_precompiled(DIR, model)``.

The manifest and every artifact are checked (signature, checksum, fingerprint, the model's parameters)
before torch's unpickler sees a byte. A call runs the first artifact whose Dynamo guards accept it, with
no trace; a call none accepts (a shape outside every precompiled range) is compiled by ``torch.compile``
with the same backend and settings, after one warning naming the guard that failed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.hooks import RemovableHandle

from recipecache.signing import Signer, own_signer

from ..errors import one_line
from ..formats.precompiled import PrecompileError, check_fingerprint, read_artifact, read_manifest
from ..serve.precompiled import PrecompiledGraph, here, loading_settings

log = logging.getLogger(__name__)


def load_precompiled(directory: str | os.PathLike, model: torch.nn.Module, *, options: dict | None = None
                     ) -> "PrecompiledModel":
    """The model served from a precompiled directory; PrecompileError (one line) if it cannot be.

    ``options``: hpu_backend options for this process (a recipe-changing one that differs from the build's is
    refused). The manifest and every artifact must be signed with the key here: ``HPURECIPE_BUNDLE_KEY`` if set,
    else this machine's own key (the one ``hpurecipe precompile`` signs with when no team key is set); anything
    else is refused, since an artifact holds a pickle.
    """
    directory = Path(directory)
    signer = own_signer()
    manifest = read_manifest(directory, signer)
    check_parameters(manifest["parameters"], model, directory)
    settings = loading_settings(manifest.get("settings"), options)
    ours = here(settings)
    check_fingerprint(manifest["fingerprint"], ours, str(directory))
    record = manifest.get("modules") if isinstance(manifest.get("modules"), dict) else module_record(model)
    if differs := module_difference(record, model, "classes"):
        raise PrecompileError(f"{directory}: {differs}; precompile it again")
    _alias_model_module(manifest.get("model_class"), model)
    functions = [_load(directory, entry, ours, signer) for entry in manifest["artifacts"]]
    return PrecompiledModel(model, functions, dict(manifest, modules=record), options)


def call_model(model: torch.nn.Module, *args: Any) -> Any:
    """What an artifact captures: the model called as a module (hooks included), taken as an argument so that the
    artifact holds no module and serves the one given to load_precompiled."""
    return model(*args)


def _alias_model_module(recorded: Any, model: torch.nn.Module) -> None:
    """Make the module the model's class comes from importable under the name it had when precompiled, if that
    name is not taken: Dynamo's bytecode imports it by name, and a model file loaded another way (another loader,
    an edited copy) has another module name. Only for the same class name."""
    if not (isinstance(recorded, list) and len(recorded) == 2 and all(isinstance(x, str) for x in recorded)):
        return
    name, qualname = recorded
    cls = type(model)
    if name not in sys.modules and cls.__qualname__ == qualname and cls.__module__ in sys.modules:
        sys.modules[name] = sys.modules[cls.__module__]


def _load(directory: Path, entry: dict, ours: dict, signer: Signer | None) -> "Unpickled":
    """An artifact read and checked (signature, checksum, the manifest's digest, fingerprint), to be unpickled by
    torch when a call first reaches the sizes it serves."""
    path = directory / entry["file"]
    if not path.exists():
        raise PrecompileError(f"{directory}: {entry['file']} is listed in the manifest but missing")
    artifact = read_artifact(path, signer)  # signature and checksum: before unpickling
    if artifact.digest != entry["sha256"]:
        raise PrecompileError(f"{path}: not the artifact the manifest lists (checksum differs)")
    check_fingerprint(artifact.info["fingerprint"], ours, str(path))
    return Unpickled(path, artifact.torch_bytes)


class Unpickled:
    """A checked artifact, unpickled by torch on first use (``fn``): its guards are built then, once, so that
    loading a directory of many ranges costs only the ranges the calls reach."""

    def __init__(self, path: Path, torch_bytes: bytes):
        self.path = path
        self._bytes: bytes | None = torch_bytes
        self._fn = None

    @property
    def fn(self):
        if self._fn is None:
            self._fn = _deserialize(self.path, self._bytes)
            self._bytes = None
        return self._fn


def _deserialize(path: Path, torch_bytes: bytes):
    """torch's function from an artifact's checked bytes; PrecompileError (one line) if it cannot serve here."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    try:
        fn = AOTCompiledFunction.deserialize(torch_bytes, f_globals=call_model.__globals__)
    except PrecompileError as e:
        raise PrecompileError(f"{path}: {e}") from None
    except Exception as e:  # torch's loader raises many types; the artifact was checked, so say which
        raise PrecompileError(f"{path}: torch cannot load it ({one_line(e)})") from None
    if not isinstance(fn._artifacts.compiled_fn, PrecompiledGraph):
        raise PrecompileError(f"{path}: not compiled by hpu_backend")
    _check_sources(fn._artifacts.source_info, path)
    fn.disable_guard_check()  # checked once per call by PrecompiledModel
    return fn


def _check_sources(info, path: Path) -> None:
    """PrecompileError if a source Dynamo inlined while capturing (the model's forward, the modules it calls)
    reads differently here: the captured bytecode would no longer be the model's."""
    import linecache
    import sys

    from torch._dynamo.package import _hash_source

    for s in sorted(info.inlined_sources, key=lambda s: (s.module, s.firstlineno)):
        filename = getattr(sys.modules.get(s.module), "__file__", None)
        if not filename:  # not loaded here: the model does not run that code
            continue
        lines = linecache.getlines(filename)
        if _hash_source("".join(lines[s.firstlineno - 1:s.lastlineno - 1])) != s.checksum:
            raise PrecompileError(f"{path}: the source of {s.module} (lines {s.firstlineno}-{s.lastlineno}) changed "
                                  "since it was precompiled; precompile it again")


def model_parameters(model: torch.nn.Module) -> dict[str, list]:
    """name -> [shape, dtype] of the model's parameters and buffers (what an artifact's graphs take)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {name: [list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in named}


# -- what Dynamo guarded about the module and the artifacts cannot keep ------------------------------------------
# Dynamo guards the module's structure and its hooks through the identity of its objects, which no other process
# shares, so those guards are left out of the saved artifacts (see precompile.serializable_guards). They are
# recorded here by name instead, compared at load, and watched on every call.

GLOBAL_HOOKS = "<every module>"  # the name under which torch's global module hooks are recorded


def module_record(model: torch.nn.Module) -> dict[str, Any]:
    """The module tree (name -> class) and its forward hooks and forward pre-hooks (name -> kind -> the hook
    functions' names, in order), torch's global module hooks under GLOBAL_HOOKS."""
    hooks = {name: h for name, m in model.named_modules() if (h := _hooks(m._forward_hooks, m._forward_pre_hooks))}
    hooks.update({GLOBAL_HOOKS: h} if (h := _hooks(*_global_hook_dicts())) else {})
    return {"classes": {name: _class_name(m) for name, m in model.named_modules()}, "hooks": hooks}


def _hooks(forward: dict, pre: dict) -> dict[str, list[str]]:
    return {kind: [_function_name(f) for f in d.values()] for kind, d in (("forward", forward),
                                                                          ("forward pre", pre)) if d}


def _global_hook_dicts() -> tuple[dict, dict]:
    from torch.nn.modules import module

    return module._global_forward_hooks, module._global_forward_pre_hooks


def _class_name(m: Any) -> str:
    return f"{type(m).__module__}.{type(m).__qualname__}"


def _function_name(f: Any) -> str:
    f = getattr(f, "__func__", f)
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', type(f).__qualname__)}"


def module_difference(recorded: dict, model: torch.nn.Module, part: str) -> str:
    """How ``model``'s module classes (``part`` "classes") or hooks ("hooks") differ from ``recorded``
    (``module_record``), in words; "" when they do not."""
    theirs, mine = recorded.get(part) or {}, module_record(model)[part]
    what = "is a" if part == "classes" else "has hooks:"
    for name in sorted(set(theirs) | set(mine), key=str):
        if theirs.get(name) != mine.get(name):
            who = "the model" if not name else "every module" if name == GLOBAL_HOOKS else f"the model's {name!r}"
            return f"{who} {what} {_listed(mine.get(name))} (precompiled with {_listed(theirs.get(name))})"
    return ""


def _listed(value: Any) -> str:
    if not value:
        return "none"
    if isinstance(value, dict):
        return "; ".join(f"{kind} hook {', '.join(map(str, fns))}" for kind, fns in value.items())
    return str(value)


class ModuleWatch:
    """What may change in a model between calls, as it was when watched: ``changed()`` on each call compares the
    hook handles' counter (every hook registered anywhere takes the next id), how many forward hooks and pre-hooks
    the modules and torch's global tables hold, and how many children the modules have and the sum of their ids
    (a submodule replaced is another object), all at C speed."""

    def __init__(self, model: torch.nn.Module):
        modules = list(model.modules())
        self.hooks = [d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks)]
        self.hooks += list(_global_hook_dicts())
        self.trees = [m._modules for m in modules]
        self.state = self.now()

    def now(self) -> tuple:
        children = itertools.chain.from_iterable(map(dict.values, self.trees))
        return RemovableHandle.next_id, sum(map(len, self.hooks)), sum(map(len, self.trees)), sum(map(id, children))

    def changed(self) -> bool:
        return self.now() != self.state


def check_parameters(recorded: dict, model: torch.nn.Module, where: Path) -> None:
    """PrecompileError naming the first parameter or buffer that differs from the one the artifacts took."""
    ours = model_parameters(model)
    for name in sorted(set(recorded) | set(ours)):
        if recorded.get(name) != ours.get(name):
            got = "missing" if name not in ours else f"{ours[name][0]} {ours[name][1]}"
            want = "absent" if name not in recorded else f"{recorded[name][0]} {recorded[name][1]}"
            raise PrecompileError(f"{where}: the model's {name} is {got}, the artifacts were built with {want}")


class PrecompiledModel:
    """Calls ``model`` through its precompiled artifacts (inference, under no_grad), falling back softly.

    A call runs the first artifact that serves its sizes (the buckets its recipes hold, as listed) and whose
    Dynamo guards accept it. Any other call, and every call while the model differs from the one precompiled
    (a hook added or removed, a submodule replaced, what Dynamo guarded and the artifacts cannot keep), is
    compiled by torch.compile with the same backend and settings, after one warning naming why.
    """

    def __init__(self, model: torch.nn.Module, functions: list, manifest: dict, options: dict | None):
        self.model = model
        self.functions = functions
        self.manifest = manifest
        self.options = {**manifest.get("settings", {}), **(options or {})}
        self.sizes = [_sizes(entry, manifest.get("dims")) for entry in manifest["artifacts"]]
        self.watch = ModuleWatch(model)
        self.differs = self._difference()
        self._fallback: Callable | None = None
        self._warned: set[str] = set()

    def __call__(self, *args: Any) -> Any:
        if self.watch.changed():
            self.watch = ModuleWatch(self.model)
            self.differs = self._difference()
        # call_model's frame, as its guards read it; the guards once, then Dynamo's bytecode directly
        f_locals = {"model": self.model, "args": args}
        with torch.no_grad():
            if self.differs:
                return self._compiled(f"{self.differs}, which the artifacts do not run")(*args)
            for artifact, sizes in zip(self.functions, self.sizes):
                if _outside(sizes, args) is None and (fn := artifact.fn)._artifacts.guard_manager.check(f_locals):
                    return fn.fn(self.model, *args)
            return self._compiled(f"no artifact accepts this call ({self.failed_guard(args, {})})")(*args)

    def _difference(self) -> str:
        record = self.manifest["modules"]
        return module_difference(record, self.model, "classes") or module_difference(record, self.model, "hooks")

    def _compiled(self, why: str) -> Callable:
        """torch.compile with the same backend and settings, after one warning saying why (once per reason)."""
        reason = why.split(" (")[0]
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("hpu_backend: precompiled %s: %s; compiling it with torch.compile instead",
                        self.manifest.get("model", "model"), why)
        if self._fallback is None:
            dynamic = self.manifest.get("dynamic")
            # call_model, as the artifacts capture it: torch.compile(module) would run global hooks twice
            compiled = torch.compile(call_model, backend="hpu_backend", options=self.options,
                                     **({} if dynamic is None else {"dynamic": dynamic}))
            self._fallback = functools.partial(_with_hook_guards, compiled, self.model)
        return self._fallback

    def failed_guard(self, args: tuple, kwargs: dict) -> str:
        """Per artifact, the guard this call fails, in one line: a size outside those it serves, or Dynamo's."""
        parts = []
        for artifact, entry, sizes in zip(self.functions, self.manifest["artifacts"], self.sizes):
            outside = _outside(sizes, args)
            if outside is not None:
                parts.append(f"{entry['file']}: {outside} is outside {_spans(entry.get('serves'))}")
                continue
            fn = artifact.fn
            f_locals = fn.prepare_f_locals(self.model, *args, **kwargs)
            text = " ".join(str(fn._artifacts.guard_manager.check_verbose(f_locals).verbose_code_parts).split())
            parts.append(f"{entry['file']}: {text[:200]}")
        return "; ".join(parts)[:600]


def _with_hook_guards(compiled: Callable, *args: Any) -> Any:
    """``compiled(*args)`` with Dynamo guarding the modules' hooks, which it skips by default (a hook added after
    compiling would be silently left out): the fallback serves the model as it is at each call."""
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        return compiled(*args)


def _sizes(entry: dict, dims: Any) -> list[tuple[str, int, int, list]]:
    """(axis, input, dim, spans) to check a call against: the sizes an artifact serves, read from the inputs."""
    serves = entry.get("serves")
    if not isinstance(serves, dict) or not isinstance(dims, dict):
        return []  # precompiled before sizes were recorded: Dynamo's guards alone
    return [(axis, i, d, spans) for axis, spans in serves.items() for i, d in dims.get(axis, [])]


def _outside(sizes: list, args: tuple) -> str | None:
    """The first input size a call has outside the served spans ("batch=3"), or None."""
    for axis, i, d, spans in sizes:
        x = args[i] if i < len(args) else None
        if isinstance(x, torch.Tensor) and x.dim() > d and not any(lo <= x.shape[d] <= hi for lo, hi in spans):
            return f"{axis}={x.shape[d]}"
    return None


def _spans(serves: Any) -> str:
    """``{"batch": [[2, 3], [5, 8]]}`` as "batch=2..3,5..8", as the listing shows it."""
    if not isinstance(serves, dict):
        return "-"
    return " ".join(f"{axis}=" + ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in spans)
                    for axis, spans in serves.items())
