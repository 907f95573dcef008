"""``hpurecipe precompile``: a model file captured once per bucket range by ``aot_compile``, saved signed.

Every shape point of the model file runs through the first artifact whose Dynamo guards accept it (which
takes up that bucket's recipe, and is compared with eager); a point no artifact accepts is captured anew
(``torch.compile(call_model, fullgraph=True, backend="hpu_backend").aot_compile``, the model an argument). So a dynamic
model gets one artifact per range
Dynamo can serve with one graph (size 1 is its own), a static one an artifact per point. Each artifact
carries its program and the recipes of its points; a manifest lists them with their ranges, the
fingerprint and the model's parameters. Everything is signed: with ``HPURECIPE_BUNDLE_KEY`` when it is set, else
with this machine's own key (made by the first precompile).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recipecache import CacheConfig
from recipecache.signing import own_signer

from ..errors import first_line, one_line
from ..formats.precompiled import MAGIC, MANIFEST, MANIFEST_VERSION, PrecompileError, artifact_bytes, manifest_bytes
from ..serve.precompiled import PrecompiledGraph, plain_settings
from ..settings import Settings
from ..modelfiles.modelspec import ModelSpec, point_label
from .precompiled import call_model, model_parameters, module_record
from .warm import _options


@dataclass
class Captured:
    """One artifact: an aot-compiled function and the points it was run at."""

    fn: Any  # torch's AOTCompiledFunction
    points: list[dict[str, int]] = field(default_factory=list)
    serves: dict[str, list[list[int]]] = field(default_factory=dict)  # per axis, the sizes served without compiling

    @property
    def graph(self) -> PrecompiledGraph:
        return self.fn._artifacts.compiled_fn

    def ranges(self) -> dict[str, list[int]]:
        return {axis: [min(p[axis] for p in self.points), max(p[axis] for p in self.points)]
                for axis in self.points[0]}


@dataclass
class PrecompileReport:
    model: str
    directory: str
    signer: str  # "team" (HPURECIPE_BUNDLE_KEY) or "machine" (this user's own key)
    artifacts: list[dict[str, Any]]  # file, ranges, points, recipes, bytes, recipe_bytes


def precompile(spec: ModelSpec, out: str | os.PathLike, cache_config: CacheConfig | None = None) -> PrecompileReport:
    """Capture ``spec`` per bucket range and write the artifacts and the manifest into ``out``."""
    out = Path(out)
    _check_out(out)
    model = spec.build_model().eval()
    options = _options(spec, cache_config)
    captured: list[Captured] = []
    shapes = []
    settings = Settings.from_options(options)
    with torch.no_grad():
        for point in spec.points():
            inputs = spec.split(spec.inputs(point))
            shapes.append([list(t.shape) if isinstance(t, torch.Tensor) else None for t in inputs])
            entry = next((c for c in captured if c.fn.guard_check(model, *inputs)), None)
            if entry is None:
                entry = Captured(_capture(spec, model, inputs, options))
                captured.append(entry)
            entry.points.append(point)
            got = entry.fn(model, *inputs)  # takes up this point's bucket: its recipe goes into the artifact
            _check(spec, point, got, model(*inputs))
        for c in captured:
            c.serves = served_sizes(spec, model, c, settings)
    return _write(spec, out, model, captured, settings, axis_dims(spec, shapes))


def axis_dims(spec: ModelSpec, shapes: list[list]) -> dict[str, list[list[int]]]:
    """Per axis, the [input, dim] of the model's inputs whose size is the axis's value at every point (how a call's
    sizes are read back as the model file's axes)."""
    points = spec.points()
    first = shapes[0]
    dims: dict[str, list[list[int]]] = {}
    for axis in spec.axes:
        dims[axis] = [[i, d] for i, shape in enumerate(first) if shape is not None for d in range(len(shape))
                      if all(s[i] is not None and len(s[i]) > d and s[i][d] == p[axis] for s, p in zip(shapes, points))]
    return dims


def served_sizes(spec: ModelSpec, model: torch.nn.Module, c: Captured, settings: Settings) -> dict[str, list]:
    """Per axis, the sizes the artifact serves from the recipes it carries: each point's bucket under the
    ``buckets`` policy where the axis is dynamic in its graph (from 2: Dynamo specializes 0 and 1), the points'
    own sizes where it is static. A call at another size would compile a bucket, so it is not served."""
    policy = _policy(settings.buckets)
    out = {}
    for axis in c.points[0]:
        values = sorted({p[axis] for p in c.points})
        dynamic = policy is not None and (len(values) > 1 or _accepts_neighbour(spec, model, c, axis))
        spans = [_bucket(policy, v) if dynamic and v >= 2 else (v, v) for v in values]
        out[axis] = _merged(spans)
    return out


def _policy(setting: Any) -> Any:
    """The one bucket policy of every symbol (None when symbols have policies of their own: which symbol an axis
    is, this cannot tell, so only the points are claimed)."""
    from ..buckets import parse_policy

    if isinstance(setting, str):
        return parse_policy(setting)
    table = dict(setting)
    return parse_policy(table.get("*", "exp")) if set(table) <= {"*"} else None


def _bucket(policy: Any, v: int) -> tuple[int, int]:
    lo, hi = policy.bucket(v)
    return max(lo, 2), hi


def _merged(spans: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _accepts_neighbour(spec: ModelSpec, model: torch.nn.Module, c: Captured, axis: str) -> bool:
    """Whether the artifact's guards take the axis one larger than its only value (whether it is dynamic)."""
    from ..modelfiles.modelspec import ModelFileError

    point = c.points[0]
    try:
        inputs = spec.split(spec.inputs({**point, axis: point[axis] + 1}))
    except ModelFileError:  # the model file takes no other size there: claim the point alone
        return False
    return bool(c.fn.guard_check(model, *inputs))


def serializable_guards(entries) -> list[bool]:
    """The guards an artifact can keep: aot_compile's own choice (no globals, no guard on an object's identity),
    also leaving out guards derived from one on an identity (a module's hook dict, a config object's type), which
    aot_compile's filter lets through and its serializer then refuses. The model's tensors and the shapes stay
    guarded; that the model is the one captured is checked by its parameters and the sources Dynamo inlined."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (e.is_global or e.guard_type in unsupported or unsupported.intersection(e.derived_guard_types or ()))
            for e in entries]


def _capture(spec: ModelSpec, model: torch.nn.Module, inputs: tuple, options: dict):
    kwargs = {} if spec.dynamic is None else {"dynamic": spec.dynamic}
    compiled = torch.compile(call_model, fullgraph=True, backend="hpu_backend",
                             options={**options, "guard_filter_fn": serializable_guards}, **kwargs)
    try:
        return _aot_compile(compiled, (model, *inputs))
    except torch._dynamo.exc.Unsupported as e:
        raise PrecompileError(f"{spec.path}: Dynamo cannot capture the model in one graph (graph break: "
                              f"{first_line(e, 200) or type(e).__name__}); use `hpurecipe warm` instead, which "
                              "serves graph breaks") from None
    except PrecompileError:
        raise
    except Exception as e:  # Dynamo and the backend raise many types; one line names it
        raise PrecompileError(f"{spec.path}: cannot precompile it ({one_line(e)})") from None


def _check(spec: ModelSpec, point: dict[str, int], got: Any, want: Any) -> None:
    """PrecompileError if the captured function's result at ``point`` differs from eager's."""
    try:
        torch.testing.assert_close(got, want)
    except (AssertionError, TypeError, ValueError) as e:
        raise PrecompileError(f"{spec.path}: at {point_label(point)} the precompiled result differs from eager "
                              f"({first_line(e, 200) or type(e).__name__})") from None


def _aot_compile(compiled, args: tuple, attempts: int = 4):
    """``aot_compile`` with float values specialized: a float Dynamo would make an input (a module's ``math.pi``)
    gets a shape guard that reads the global through a scope torch does not save, so the loaded guards would
    always fail. Captured again while AOTAutograd's float pass asks for floats to be specialized (Dynamo's own
    frame conversion restarts the same way; aot_compile leaves it to its caller)."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import TensorifyState

    try:
        with torch._dynamo.config.patch(specialize_float=True):
            for _ in range(attempts - 1):
                try:
                    return compiled.aot_compile((args, {}))
                except TensorifyScalarRestartAnalysis:
                    continue
            return compiled.aot_compile((args, {}))
    finally:
        TensorifyState.clear()


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PrecompileError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(p.name != MANIFEST and not p.name.endswith(".hpuaot") for p in out.iterdir()):
        raise PrecompileError(f"{out}: holds other files; precompile into an empty or earlier precompiled directory")


def _write(spec: ModelSpec, out: Path, model: torch.nn.Module, captured: list[Captured],
           settings: Settings, dims: dict[str, list[list[int]]]) -> PrecompileReport:
    from torch._dynamo.aot_compile import AOTCompiledFunction

    signer = own_signer(create=True)  # the team key, else this machine's own (made now if need be)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, c in enumerate(captured):
        graph = c.graph
        recipes = graph.recipes()
        info = {"fingerprint": graph.fingerprint(), "program": graph.key or "",
                "recipes": sorted(recipes), "mode": graph.program.mode if graph.program else "",
                "model": spec.name, "ranges": c.ranges(), "serves": c.serves,
                "recipe_bytes": sum(map(len, recipes.values())), "signer": signer.record()}
        _without_source_texts(c.fn)
        try:
            torch_bytes = AOTCompiledFunction.serialize(c.fn).serialized_data
        except RuntimeError as e:
            raise PrecompileError(f"{spec.path}: torch cannot save the captured function ({one_line(e)})") from None
        data = artifact_bytes(info, torch_bytes, signer.key)
        name = f"range-{i:03d}.hpuaot"
        _atomic_write(out / name, data)
        entries.append({"file": name, "ranges": info["ranges"], "serves": c.serves, "points": len(c.points),
                        "bytes": len(data),
                        "recipes": len(recipes), "recipe_bytes": info["recipe_bytes"],
                        "sha256": _payload_digest(data)})
    _remove_stale(out, {e["file"] for e in entries})
    doc = {"version": MANIFEST_VERSION, "model": spec.name, "axes": spec.axes, "dynamic": spec.dynamic,
           "model_class": [type(model).__module__, type(model).__qualname__],
           "fingerprint": captured[0].graph.fingerprint(), "settings": plain_settings(settings),
           "parameters": model_parameters(model), "modules": module_record(model), "dims": dims,
           "artifacts": entries, "signer": signer.record()}
    _atomic_write(out / MANIFEST, manifest_bytes(doc, signer.key))
    return PrecompileReport(spec.name, str(out), signer.kind, entries)


def _without_source_texts(fn) -> None:
    """Keep the checksum of each source Dynamo inlined, drop the copy of its whole module (most of torch's part
    of an artifact; the loader compares the checksums with the sources it has)."""
    info = fn._artifacts.source_info
    info.inlined_sources = {dataclasses.replace(s, content="") for s in info.inlined_sources}


def _payload_digest(data: bytes) -> str:
    return data[len(MAGIC):len(MAGIC) + 32].hex()


def _remove_stale(out: Path, keep: set[str]) -> None:
    for p in out.iterdir():
        if p.name.endswith(".hpuaot") and p.name not in keep:
            p.unlink()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
