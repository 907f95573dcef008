"""Serving a precompiled directory (``hpurecipe precompile``): ``load_precompiled(DIR, model)``.

The manifest and every artifact are checked (signature, checksum, fingerprint, the model's parameters)
before torch's unpickler sees a byte. A call runs the first artifact whose Dynamo guards accept it, with
no trace; a call none accepts (a shape outside every precompiled range) is compiled by ``torch.compile``
with the same backend and settings, after one warning naming the guard that failed.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import one_line
from ..formats.precompiled import PrecompileError, check_fingerprint, read_artifact, read_manifest
from ..serve.precompiled import PrecompiledGraph, here, loading_settings

log = logging.getLogger(__name__)


def load_precompiled(directory: str | os.PathLike, model: torch.nn.Module, *, options: dict | None = None,
                     allow_unsigned: bool | None = None) -> "PrecompiledModel":
    """The model served from a precompiled directory; PrecompileError (one line) if it cannot be.

    ``options``: hpu_backend options for this process (a recipe-changing one that differs from the build's is
    refused). ``allow_unsigned``: load artifacts written without ``HPURECIPE_BUNDLE_KEY`` (default:
    ``HPURECIPE_TRUST_UNSIGNED=1``); they hold a pickle, so only for files you built yourself.
    """
    directory = Path(directory)
    manifest = read_manifest(directory, allow_unsigned=allow_unsigned)
    check_parameters(manifest["parameters"], model, directory)
    settings = loading_settings(manifest.get("settings"), options)
    ours = here(settings)
    check_fingerprint(manifest["fingerprint"], ours, str(directory))
    _alias_model_module(manifest.get("model_class"), model)
    functions = [_load(directory, entry, ours, allow_unsigned) for entry in manifest["artifacts"]]
    return PrecompiledModel(model, functions, manifest, options)


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


def _load(directory: Path, entry: dict, ours: dict, allow_unsigned: bool | None):
    from torch._dynamo.aot_compile import AOTCompiledFunction

    path = directory / entry["file"]
    if not path.exists():
        raise PrecompileError(f"{directory}: {entry['file']} is listed in the manifest but missing")
    artifact = read_artifact(path, allow_unsigned=allow_unsigned)  # signature and checksum: before unpickling
    if artifact.digest != entry["sha256"]:
        raise PrecompileError(f"{path}: not the artifact the manifest lists (checksum differs)")
    check_fingerprint(artifact.info["fingerprint"], ours, str(path))
    try:
        fn = AOTCompiledFunction.deserialize(artifact.torch_bytes, f_globals=call_model.__globals__)
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


def check_parameters(recorded: dict, model: torch.nn.Module, where: Path) -> None:
    """PrecompileError naming the first parameter or buffer that differs from the one the artifacts took."""
    ours = model_parameters(model)
    for name in sorted(set(recorded) | set(ours)):
        if recorded.get(name) != ours.get(name):
            got = "missing" if name not in ours else f"{ours[name][0]} {ours[name][1]}"
            want = "absent" if name not in recorded else f"{recorded[name][0]} {recorded[name][1]}"
            raise PrecompileError(f"{where}: the model's {name} is {got}, the artifacts were built with {want}")


class PrecompiledModel:
    """Calls ``model`` through its precompiled artifacts (inference, under no_grad), falling back softly."""

    def __init__(self, model: torch.nn.Module, functions: list, manifest: dict, options: dict | None):
        self.model = model
        self.functions = functions
        self.manifest = manifest
        self.options = {**manifest.get("settings", {}), **(options or {})}
        self._fallback: Callable | None = None
        self._warned = False

    def __call__(self, *args: Any) -> Any:
        # call_model's frame, as its guards read it; the guards once, then Dynamo's bytecode directly
        f_locals = {"model": self.model, "args": args}
        with torch.no_grad():
            for fn in self.functions:
                if fn._artifacts.guard_manager.check(f_locals):
                    return fn.fn(self.model, *args)
            return self._compiled(args, {})(*args)

    def _compiled(self, args: tuple, kwargs: dict) -> Callable:
        """torch.compile with the same backend and settings, after one warning naming the failed guard."""
        if not self._warned:
            self._warned = True
            log.warning("hpu_backend: precompiled %s: no artifact accepts this call (%s); compiling it with "
                        "torch.compile instead", self.manifest.get("model", "model"), self.failed_guard(args, kwargs))
        if self._fallback is None:
            dynamic = self.manifest.get("dynamic")
            self._fallback = torch.compile(self.model, backend="hpu_backend", options=self.options,
                                           **({} if dynamic is None else {"dynamic": dynamic}))
        return self._fallback

    def failed_guard(self, args: tuple, kwargs: dict) -> str:
        """The guard of the first artifact that this call fails, in one line."""
        fn = self.functions[0]
        f_locals = fn.prepare_f_locals(self.model, *args, **kwargs)
        text = str(fn._artifacts.guard_manager.check_verbose(f_locals).verbose_code_parts)
        return " ".join(text.split())[:200]
