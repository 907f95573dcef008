"""Recipe keys: a hash over canonical parts, each hashed on its own so a miss can be explained.

Parts: ``graph`` (ops and arguments with normalized value names and host devices, kind,
constants' bytes),
``inputs`` (dtypes, symbolic shapes and strides by normalized symbol name), ``guards``,
``bucket``, ``settings`` (every field that changes a recipe) and ``toolchain`` (torch,
hpu_backend and recipe format versions). Weights are graph inputs, so their values are never in
a key. Everything is encoded with msgpack from sorted plain data: no ``id()``, addresses, set
order or ``hash()``, so keys are the same across processes and PYTHONHASHSEED values.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from . import __version__
from .recipe import FORMAT_VERSION, Recipe
from .settings import Settings

PARTS = ("graph", "inputs", "guards", "bucket", "settings", "toolchain")


def _digest(obj: Any) -> str:
    return hashlib.blake2b(msgpack.packb(obj, use_bin_type=True), digest_size=16).hexdigest()


def toolchain() -> dict[str, Any]:
    return {"torch": torch.__version__, "hpu_backend": __version__, "recipe_format": FORMAT_VERSION}


@dataclass(frozen=True)
class GraphKey:
    """The bucket-independent parts of a graph's keys, computed once per graph."""

    parts: dict[str, str]
    detail: dict[str, Any]

    def for_bucket(self, bucket: dict[str, list[int]]) -> tuple[str, dict[str, str], dict[str, Any]]:
        """(key, per-part hashes, readable details) for one bucket of this graph."""
        canon = [[s, list(r)] for s, r in sorted(bucket.items())]
        parts = dict(self.parts, bucket=_digest(canon))
        key = _digest([parts[p] for p in PARTS])[:32]
        return key, parts, dict(self.detail, bucket={s: list(r) for s, r in bucket.items()})


def graph_key(recipe: Recipe, settings: Settings) -> GraphKey:
    """Key parts of a captured (symbolic, pass-free) recipe under ``settings``."""
    names = {n: f"i{i}" for i, n in enumerate(recipe.input_names)}
    names.update({n: f"k{i}" for i, n in enumerate(sorted(recipe.constants))})
    names.update({node.name: f"n{i}" for i, node in enumerate(recipe.nodes)})
    graph = [
        recipe.kind,
        [[node.op, _norm(node.args, names), _norm(sorted(node.kwargs.items()), names),
          [_spec(s) for s in node.out]] for node in recipe.nodes],
        _norm(recipe.outputs, names),
        [[names[k], c.dtype, c.shape, hashlib.blake2b(c.data, digest_size=16).hexdigest()]
         for k, c in sorted(recipe.constants.items())],
    ]
    settings_part = settings.key_fields()
    tc = toolchain()
    parts = {
        "graph": _digest(graph),
        "inputs": _digest([_spec(s) for s in recipe.inputs]),
        "guards": _digest(recipe.guards),
        "settings": _digest(_plain(settings_part)),
        "toolchain": _digest(sorted(tc.items())),
    }
    detail = {"settings": _plain(settings_part), "toolchain": tc,
              "inputs": [_spec(s) for s in recipe.inputs], "guards": recipe.guards}
    return GraphKey(parts, detail)


def explain(parts_a: dict[str, str], parts_b: dict[str, str]) -> list[str]:
    """The key parts that differ between two entries' recorded part hashes, in PARTS order."""
    return [p for p in PARTS if parts_a.get(p) != parts_b.get(p)]


def _spec(s) -> list:
    return [s.kind, s.dtype, s.shape, s.stride, s.expr]


def _norm(arg: Any, names: dict[str, str]) -> Any:
    if isinstance(arg, dict):
        if len(arg) == 1 and "r" in arg:
            return {"r": names[arg["r"]]}
        if len(arg) == 1 and "device" in arg:
            # The recipe is for the HPU; the host device it was traced on (cpu, or meta for a
            # compile-only prebuild) does not change it.
            return {"device": "*"}
        return {k: _norm(v, names) for k, v in sorted(arg.items())}
    if isinstance(arg, (list, tuple)):
        return [_norm(a, names) for a in arg]
    return arg


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
