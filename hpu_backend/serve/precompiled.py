"""What ``hpu_backend`` returns to Dynamo: a compiled graph that torch's ``aot_compile`` can save
(SerializableCallable).

``torch.compile(fn, fullgraph=True, backend="hpu_backend").aot_compile(...)`` keeps this object, and
``save_compiled_function`` asks it for its bytes. They are data, never a pickle of ours: msgpack of the
fingerprint, the stored settings, the program (templates, key parts, contract, guards) and the bytes of
every bucket recipe the graph has taken up. ``load_compiled_function`` rebuilds the graphs from the
program, and their buckets come from those recipes first, then from the process's store: no Dynamo,
no AOTAutograd, no lowering for a warmed bucket. The program is the one a warm cache serves
(serve/programs.py), so a precompiled function and a warm cache run the same recipes.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import msgpack
import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from .. import envs
from ..formats.precompiled import (
    NO_ACCELERATOR,
    PrecompileError,
    check_fingerprint,
    fingerprint,
)
from ..formats.program import Program
from ..formats.recipe import RecipeFormatError, unpack
from ..settings import Settings, SettingsError
from .compiled import CompiledGraph
from .programs import program_call, program_graphs
from .session import Event, emit, session_for
from .store import RecipeStore

FORMAT = "hpu_backend.precompiled"
VERSION = 2  # 2: the fingerprint names the accelerator Dynamo saw
_SUFFIX = {"forward": "fw", "backward": "bw", "inference": "inf"}
_loaded_ids = itertools.count()


def world_size() -> int:
    """The launcher's world size (1 outside one): a recipe for one shard does not serve another layout."""
    return envs.get("WORLD_SIZE")


def accelerator() -> str:
    """The accelerator Dynamo sees in this process ("none" without one). With one, Dynamo's bytecode registers
    that device's current stream, so a graph captured then cannot run where no accelerator is available."""
    if not torch.accelerator.is_available():
        return NO_ACCELERATOR
    device = torch.accelerator.current_accelerator()
    return device.type if device is not None else NO_ACCELERATOR


def here(settings: Settings) -> dict[str, Any]:
    """This process's fingerprint under ``settings``."""
    return fingerprint(settings.key_fields(), world_size(), accelerator())


class PrecompiledGraph(SerializableCallable):
    """One Dynamo graph compiled by hpu_backend, callable as Dynamo calls it, and serializable as data.

    ``source`` is what knows the graph's program and compiled graphs: the Recorder of a miss (complete once
    AOTAutograd compiled every graph), the Served result of a hit, or the graphs rebuilt from bytes.
    """

    def __init__(self, call: Callable[..., Any], settings: Settings, key: str | None, source: Any = None,
                 why_not: str = "", captured_on: str | None = None):
        self.call = call
        self.captured_on = accelerator() if captured_on is None else captured_on  # built while Dynamo traces
        self.settings = settings
        self.key = key
        self.source = source
        self.why_not = why_not  # why this graph has no program (it cannot be precompiled), if so

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    @property
    def program(self) -> Program | None:
        return getattr(self.source, "program", None)

    @property
    def graphs(self) -> list[CompiledGraph]:
        graphs = getattr(self.source, "graphs", None) or []
        return list(graphs.values()) if isinstance(graphs, dict) else list(graphs)

    def recipes(self) -> dict[str, bytes]:
        """key -> recipe bytes of every bucket this graph has taken up; PrecompileError if one runs eagerly."""
        out = {}
        for graph in self.graphs:
            for taken in graph.buckets.values():
                if taken.recipe is None or taken.key is None:
                    raise PrecompileError(f"{graph.ctx.name} runs eagerly (it could not be lowered): "
                                          "it cannot be precompiled")
                out[taken.key] = taken.recipe.to_bytes()
        return out

    def fingerprint(self) -> dict[str, Any]:
        """What a process loading this graph must match."""
        return fingerprint(self.settings.key_fields(), world_size(), self.captured_on)

    @classmethod
    def serialize_compile_artifacts(cls, fn: "PrecompiledGraph") -> bytes:
        program = fn.program
        if fn.key is None or program is None or program.mode == "restart" or getattr(fn.source, "floats", None):
            raise PrecompileError("this graph was compiled without a stored program"
                                  + (f" ({fn.why_not})" if fn.why_not else "") + ": it cannot be precompiled")
        return msgpack.packb({
            "format": FORMAT, "version": VERSION, "fingerprint": fn.fingerprint(),
            "settings": plain_settings(fn.settings), "key": fn.key, "program": program.to_bytes(),
            "recipes": fn.recipes()}, use_bin_type=True)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "PrecompiledGraph":
        doc = _document(data)
        settings = loading_settings(doc["settings"])
        check_fingerprint(doc["fingerprint"], here(settings), "precompiled graph")
        try:
            program = Program.from_bytes(doc["program"])
        except RecipeFormatError as e:
            raise PrecompileError(f"precompiled graph: its program is not usable ({e})") from None
        session = session_for(settings)
        session = dataclasses.replace(session, store=ArtifactStore(doc["recipes"], session.store))
        graph_id = next(_loaded_ids)
        graphs = program_graphs(program, doc["key"], session,
                                lambda kind: f"precompiled_{graph_id:04d}_{_SUFFIX.get(kind, kind)}", "new graph")
        emit(Event("program", program=doc["key"], hit=True))
        source = _Rebuilt(program, graphs)
        return cls(program_call(program, graphs), settings, doc["key"], source,
                   captured_on=doc["fingerprint"].get("accelerator", NO_ACCELERATOR))


class _Rebuilt:
    def __init__(self, program: Program, graphs: list[CompiledGraph]):
        self.program, self.graphs = program, graphs


class ArtifactStore(RecipeStore):
    """The recipes an artifact carries, over the process's store (a bucket it lacks is found or built there)."""

    def __init__(self, recipes: dict[str, bytes], under: RecipeStore):
        super().__init__(None, under.capacity, under.config)
        self.recipes, self.under = recipes, under

    @property
    def disk(self):
        return self.under.disk  # opened only when a bucket is not among the artifact's recipes

    def read(self, key: str) -> bytes | None:
        data = self.recipes.get(key)
        return data if data is not None else super().read(key)

    def discard(self, key: str) -> None:
        if self.recipes.pop(key, None) is None:
            super().discard(key)


_SETTING_NAMES = ("target", "buckets", "fusion", "place_on_cpu", "dtype_policy", "max_compound_op_size", "strict",
                  "model")


def plain_settings(settings: Settings, names: Any = _SETTING_NAMES) -> dict[str, Any]:
    """The settings a loaded graph runs under, as plain data (the cache configuration is the loading process's)."""
    out = {}
    for name in names:
        v = getattr(settings, name)
        out[name] = sorted(v) if isinstance(v, frozenset) else dict(v) if isinstance(v, tuple) else v
    return out


def loading_settings(stored: Any, options: dict | None = None) -> Settings:
    """The settings a loaded graph runs under: those it was built with, except where this process asks for
    another value (an option given here, or an environment variable set); the fingerprint check then refuses
    a recipe-changing difference, naming it."""
    if not isinstance(stored, dict) or not set(stored) <= set(_SETTING_NAMES):
        raise PrecompileError("precompiled graph: its settings are malformed")
    try:
        asked = Settings.from_options(options)
        explicit = set(options or {}) | {f.name for f in dataclasses.fields(Settings)
                                         if envs.is_set(f.metadata["env"])}
        merged = {**stored, **plain_settings(asked, [n for n in _SETTING_NAMES if n in explicit])}
        return Settings.from_options({**merged, **{k: v for k, v in (options or {}).items() if k not in merged}})
    except SettingsError as e:
        raise PrecompileError(f"precompiled graph: settings not usable here ({e})") from None


_FIELDS = {"fingerprint": dict, "settings": dict, "key": str, "program": bytes, "recipes": dict}


def _document(data: bytes) -> dict[str, Any]:
    try:
        doc = unpack(data)
    except RecipeFormatError as e:
        raise PrecompileError(f"precompiled graph: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PrecompileError("precompiled graph: not an hpu_backend graph")
    if doc.get("version") != VERSION:
        raise PrecompileError(f"precompiled graph: format version {doc.get('version')!r}, this reads {VERSION}")
    for name, kind in _FIELDS.items():
        if not isinstance(doc.get(name), kind):
            raise PrecompileError(f"precompiled graph: {name!r} is missing or malformed")
    if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in doc["recipes"].items()):
        raise PrecompileError("precompiled graph: its recipes are malformed")
    return doc
