"""Serve a recipe package: load it (weights bound into the executors once), then per call flatten the
arguments, pick the bucket, run its recipe.

Nothing here imports Dynamo or AOTAutograd: the package's recipes go through the same checked loader
as the cache's, the call layout is a pytree spec, and bucket selection is a dict lookup on the
symbol values read from the inputs (a new tuple of values is checked against the package's ranges,
buckets and guards once).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..formats import symexpr
from ..formats.package import Package, PackageError, check_toolchain, read_package
from ..formats.recipe import Constant
from .executor import RecipeLoadError, build_callable, load_constant
from .symbols import symbol_reader


def load_package(path: str | os.PathLike, model: torch.nn.Module | None = None) -> "PackagedModel":
    """A callable that serves the package's buckets with ``model``'s current weights.

    Without ``model``, the weights stored in the package (``--with-weights``) are used. A package
    built by another toolchain is refused, naming both; a call outside the packaged buckets raises
    PackageError naming the input and the covered range.
    """
    package = read_package(path)
    check_toolchain(package, path)
    fixed = _fixed_inputs(package, model, path)
    try:  # weights and constants bound into each executor once; a call passes only the user's inputs
        runs = [build_callable(r, {name: t for name, t in zip(r.input_names, fixed) if t is not None})
                for r in package.recipes]
    except RecipeLoadError as e:
        raise PackageError(f"{path}: a recipe cannot be loaded ({e})") from None
    return PackagedModel(package, runs)


def _fixed_inputs(package: Package, model: torch.nn.Module | None, path) -> list[Any]:
    """The graph's inputs that do not come from the call: weights and constants, checked against specs."""
    state = {} if model is None else {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if model is None and not package.weights and any(
            gi.kind in ("parameter", "buffer") for gi in package.inputs):
        raise PackageError(f"{path}: pass the model (load_package(path, model)) or build the package "
                           "--with-weights")
    fixed: list[Any] = []
    for gi, spec in zip(package.inputs, package.recipes[0].inputs):
        if gi.kind == "user":
            fixed.append(None)
            continue
        if gi.kind == "constant":
            tensor = _load(package.constants, gi.target, path)
        elif model is not None:
            tensor = state.get(gi.target)
            if tensor is None:
                raise PackageError(f"{path}: the model has no {gi.kind} {gi.target!r}")
        else:
            tensor = _load(package.weights, gi.target, path)
        if list(tensor.shape) != spec.shape or str(tensor.dtype).removeprefix("torch.") != spec.dtype:
            raise PackageError(f"{path}: {gi.kind} {gi.target!r} is {str(tensor.dtype).removeprefix('torch.')}"
                               f"{list(tensor.shape)}, the package was built for {spec.dtype}{spec.shape}")
        fixed.append(tensor.detach())
    return fixed


def _load(table: dict[str, Constant], name: str, path) -> torch.Tensor:
    if name not in table:
        raise PackageError(f"{path}: the package holds no tensor {name!r}")
    try:
        return load_constant(table[name])
    except RecipeLoadError as e:
        raise PackageError(f"{path}: tensor {name!r}: {e}") from None


class PackagedModel:
    """Serves a package: flatten the call, check its shapes, run the bucket's recipe, unflatten."""

    def __init__(self, package: Package, runs: list[Callable[[list], list]]):
        self.package = package
        self.in_spec = pytree.treespec_loads(package.in_spec)
        self.out_spec = pytree.treespec_loads(package.out_spec)
        first = package.recipes[0]
        self.symbols = first.symbols
        user_slots = [slot for slot, gi in enumerate(package.inputs) if gi.kind == "user"]
        self.user = [package.inputs[slot].index for slot in user_slots]  # where each run input is in the call
        position = {slot: i for i, slot in enumerate(user_slots)}
        if any(slot not in position for slot, _ in first.symbol_sources):
            raise PackageError(f"{package.model}: a shape symbol is read from an input that is not the user's")
        self.read_symbols = symbol_reader([[position[slot], dim] for slot, dim in first.symbol_sources])
        self.names = {slot: gi.target for slot, gi in enumerate(package.inputs)}
        self.buckets = [(r, run) for r, run in zip(package.recipes, runs)]
        self.known: dict[tuple, Callable[[list], list]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            want, got = _layout(self.in_spec), _layout(spec)
            if want == got:
                want, got = (" ".join(str(s).split()) for s in (self.in_spec, spec))
            raise PackageError(f"the package takes {want}, got {got}")
        inputs = [flat[i] for i in self.user]
        run = self.buckets[0][1]
        if self.read_symbols is not None:
            values = self.read_symbols(inputs)
            run = self.known.get(values) or self._select(values)
        with torch.no_grad():
            return pytree.tree_unflatten(run(inputs), self.out_spec)

    def _select(self, values: tuple) -> Callable[[list], list]:
        env = dict(zip(self.symbols, values))
        if not all(lo <= env[s] <= hi for s, (lo, hi) in self.package.ranges.items()):
            raise PackageError(self._outside(env))
        for recipe, run in self.buckets:
            if all(lo <= env[s] <= hi for s, (lo, hi) in recipe.bucket.items()) and all(
                    symexpr.evaluate(g, env) for g in recipe.guards):
                self.known[values] = run
                return run
        raise PackageError(self._outside(env))

    def _outside(self, env: dict[str, int]) -> str:
        """Name the first input dimension no bucket covers, and what the package covers."""
        sources = dict(zip(self.symbols, self.package.recipes[0].symbol_sources))
        for sym in self.symbols:
            spans = sorted({tuple(r.bucket[sym]) for r in self.package.recipes})
            lo, hi = self.package.ranges[sym]
            if not any(a <= env[sym] <= b for a, b in spans) or not lo <= env[sym] <= hi:
                slot, dim = sources[sym]
                covered = ", ".join(f"{max(a, lo)}-{min(b, hi)}" for a, b in spans)
                return (f"input {self.names[slot]!r} dim {dim} = {env[sym]} is outside the packaged "
                        f"buckets ({covered}); warm and package that size too")
        return f"no packaged bucket covers the sizes {env}; warm and package them too"



def _layout(spec: pytree.TreeSpec) -> str:
    """A call's (args, kwargs) layout in words."""
    args, kwargs = spec.children()
    names = ", ".join(map(str, kwargs.context or []))
    return f"{args.num_children} positional argument(s)" + (f" and keyword(s) {names}" if names else "")
