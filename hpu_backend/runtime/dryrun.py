"""Compile-only execution: outputs with the right shapes, strides and dtypes, and no compute.

``hpurecipe prebuild`` runs models this way (``options={"execute": False}``): every graph is
traced, lowered and cached as usual, but its recipe is not run; each output is a tensor of zeros
sized by evaluating the recipe's symbolic output specs on the call's symbol values. Zeros, not
uninitialized memory: a model that reads an output on the host (``.item()`` in its forward) must take
the same branch and pass Dynamo the same values on every run, or the analysis of a compile-only run
(``hpurecipe advise``) would report recompiles on whatever bytes the allocator handed back.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..formats import symexpr
from ..formats.recipe import Recipe, ValueSpec
from .executor import dtype_from_name
from .symbols import symbol_reader


def build_dry_run(recipe: Recipe) -> Callable[[list], list]:
    """``run(args) -> outputs`` that allocates the outputs instead of computing them."""
    specs = {name: [spec] for name, spec in zip(recipe.input_names, recipe.inputs)}
    specs.update({node.name: node.out for node in recipe.nodes})
    index = {name: i for i, name in enumerate(recipe.input_names)}
    read, symbols = symbol_reader(recipe.symbol_sources), recipe.symbols

    def run(args: list) -> list:
        env = dict(zip(symbols, read(args))) if read is not None else {}
        outs = [_make(o, specs, index, args, env) for o in recipe.outputs]
        args.clear()
        return outs

    return run


def _make(out, specs, index, args, env):
    if not (isinstance(out, dict) and "r" in out):
        return out  # a constant output (None, an int)
    name = out["r"]
    if name in index:
        return args[index[name]]
    spec: ValueSpec = specs[name][0]
    if spec.kind == "tensor":
        shape = [symexpr.evaluate(d, env) for d in spec.shape]
        stride = [symexpr.evaluate(d, env) for d in spec.stride] or None
        dtype = dtype_from_name(spec.dtype)
        out = torch.empty_strided(shape, stride, dtype=dtype) if stride else torch.empty(shape, dtype=dtype)
        return _zeroed(out)
    if spec.kind in ("sym", "scalar"):
        return symexpr.evaluate(spec.expr, env)
    return None


# glibc serves every allocation past its largest mmap threshold (32 MiB) from fresh pages, which the kernel
# zeroes; writing them here would make a compile-only run touch (and hold) memory it never needed.
FRESH_PAGES_BYTES = 32 << 20


def _zeroed(out: torch.Tensor) -> torch.Tensor:
    if out.untyped_storage().nbytes() < FRESH_PAGES_BYTES:
        out.zero_()
    return out
