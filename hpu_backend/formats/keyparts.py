"""What a key is made of, readable without torch: its parts, the toolchain, and why two keys differ.

The cache-only commands of ``hpurecipe`` (``ls``, ``show``, ``explain``, ``export``, ...) use this
module and never import torch; ``keys.py`` computes the parts from graphs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sys
from collections import Counter
from typing import Any

from .recipe import FORMAT_VERSION
from ..version import __version__

PARTS = ("graph", "inputs", "guards", "bucket", "settings", "toolchain")


def torch_version() -> str:
    """torch's version: from the module when it is loaded, else from its installed metadata (same string)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def toolchain() -> dict[str, Any]:
    """What produced a recipe: a recipe built by another toolchain is never used."""
    return {"torch": torch_version(), "hpu_backend": __version__, "recipe_format": FORMAT_VERSION}


def toolchain_id() -> str:
    """A short name for this toolchain (the fleet tier's namespace: two torch versions never share one)."""
    text = ",".join(f"{k}={v}" for k, v in sorted(toolchain().items()))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def differing(parts_a: dict[str, str], parts_b: dict[str, str]) -> list[str]:
    """The key parts that differ between two entries' recorded part hashes, in PARTS order."""
    return [p for p in PARTS if parts_a.get(p) != parts_b.get(p)]


def explain(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[dict[str, Any]]:
    """Why two cached entries have different keys, from their stored metadata: one row ``{"part", "a", "b"}``
    per differing part, with the readable values where recorded (settings, toolchain, bucket), else hashes."""
    rows = []
    for part in differing(meta_a.get("key_parts", {}), meta_b.get("key_parts", {})):
        da, db = meta_a.get("key_detail", {}).get(part), meta_b.get("key_detail", {}).get(part)
        rows.append({"part": part,
                     "a": da if da is not None else meta_a.get("key_parts", {}).get(part),
                     "b": db if db is not None else meta_b.get("key_parts", {}).get(part)})
    return rows


# -- why a lookup missed ----------------------------------------------------------------------------------------

# The part that names the graph itself, per entry kind: an entry with the same graph and another key is the one a
# miss is explained against.
GRAPH_PART = {"recipe": "graph", "program": "dynamo_graph"}
INPUT_FIELDS = ("kind", "dtype", "shape", "stride", "requires_grad", "parameter", "device", "layout")
RECIPE_INPUT_FIELDS = ("kind", "dtype", "shape", "stride", "expr")
STATE_FIELDS = ("grad mode", "autocast", "autocast cache", "deterministic algorithms", "default dtype",
                "AOTAutograd config")


def entry_kind(meta: dict[str, Any]) -> str:
    return "program" if meta.get("kind") == "program" else "recipe"


def nearest(metas: list[dict[str, Any]], kind: str, parts: dict[str, str]) -> dict[str, Any] | None:
    """Of the entries' metadata, the one of the same kind and graph as ``parts`` with the fewest other differing
    parts (None: the cache holds no other key for this graph)."""
    graph = GRAPH_PART[kind]
    same = [m for m in metas if entry_kind(m) == kind and m.get("key_parts", {}).get(graph) == parts.get(graph)
            and m.get("key_parts") != parts]
    return min(same, key=lambda m: len(_differing(m.get("key_parts", {}), parts)), default=None)


def miss_reasons(old: dict[str, Any], parts: dict[str, str], detail: dict[str, Any]) -> list[str]:
    """What differs between a cached entry's key (its metadata ``old``) and the key looked up, old → new, one
    readable line per difference ("torch 2.13.0 → 2.13.1", "input 0 dtype float32 → float64")."""
    reasons = []
    for part in _differing(old.get("key_parts", {}), parts):
        was, now = old.get("key_detail", {}).get(part), detail.get(part)
        lines = _describe(part, was, now) if was is not None and now is not None else []
        reasons += lines or [f"{part} differs ({str(old.get('key_parts', {}).get(part))[:8]} → "
                             f"{str(parts.get(part))[:8]}: not recorded readably)"]
    return reasons


def new_shape(reasons: list[str] | tuple[str, ...]) -> bool:
    """Whether these differences are only a new shape (another bucket, input shapes or strides): a graph meeting a
    shape it was not built for, which is no key problem and not worth a warning."""
    return all(r.startswith("bucket.") or re.match(r"input \d+ (shape|stride) ", r) for r in reasons)


def _differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [p for p in dict.fromkeys([*a, *b]) if a.get(p) != b.get(p)]


def _describe(part: str, was: Any, now: Any) -> list[str]:
    if part in ("toolchain", "settings", "bucket") and isinstance(was, dict) and isinstance(now, dict):
        prefix = "" if part == "toolchain" else f"{part}."
        return [f"{prefix}{k} {_show(was.get(k))} → {_show(now.get(k))}" for k in sorted({*was, *now})
                if was.get(k) != now.get(k)]
    if part == "inputs" and isinstance(was, list) and isinstance(now, list):
        return _inputs(was, now)
    if part == "state" and isinstance(was, list) and isinstance(now, list):
        return [f"{name} {_show(a)} → {_show(b)}" for name, a, b in zip(STATE_FIELDS, was, now) if a != b]
    return [] if was == now else [f"{part} {_show(was)} → {_show(now)}"]


def readable_input(spec: Any) -> Any:
    """A program key's input spec (a list, as keyed and stored) as ``{field: value}``; anything else as it is."""
    if isinstance(spec, list) and spec[:1] == ["tensor"]:
        return dict(zip(INPUT_FIELDS, spec))
    if isinstance(spec, list) and spec:
        return {"kind": spec[0], "value": spec[1:]}
    return spec


def _inputs(was: list, now: list) -> list[str]:
    if len(was) != len(now):
        return [f"inputs {len(was)} → {len(now)}"]
    lines = []
    for i, (a, b) in enumerate(zip(map(readable_input, was), map(readable_input, now))):
        if isinstance(a, dict) and isinstance(b, dict):
            lines += [f"input {i} {k} {_show(a.get(k))} → {_show(b.get(k))}" for k in dict.fromkeys([*a, *b])
                      if a.get(k) != b.get(k)]
        elif a != b:
            lines.append(f"input {i} {_show(a)} → {_show(b)}")
    return lines


def _show(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def usable(metas: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """How many of these entries this toolchain can hit, and why the others cannot ("torch 2.11.0 (here
    2.13.0)"), from the toolchain each entry recorded (an entry without a readable one counts as usable)."""
    ours, count, why = toolchain(), 0, Counter()
    for meta in metas:
        theirs = meta.get("key_detail", {}).get("toolchain")
        differ = [] if not isinstance(theirs, dict) else \
            [f"{k} {theirs.get(k)} (here {v})" for k, v in ours.items() if k in theirs and theirs[k] != v]
        count += not differ
        why.update(differ)
    return count, [w for w, _ in why.most_common()]
