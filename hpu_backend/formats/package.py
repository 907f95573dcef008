"""Recipe packages: one file that serves a model's warmed buckets with no trace at all — its data format.

A package (built by ``hpurecipe package``, see aot/package.py) holds an exported inference graph
lowered to one recipe per shape bucket, the input/output contract (which graph inputs are the
model's parameters, buffers and constants, and the pytree layout of the call's arguments and
results), the ranges its shape symbols may take, and the toolchain it was built with;
optionally the weights. It is msgpack data, checked like a recipe. This module does not import
torch (``hpurecipe show``/``ls`` read packages without it); runtime/packaged.py serves them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from . import keyparts
from .recipe import Constant, Recipe, RecipeFormatError, unpack, versioned

PACKAGE_VERSION = 1
MAGIC = b"HPUPKG\x00\x01"  # then the payload's sha256, then the msgpack payload
INPUT_KINDS = ("parameter", "buffer", "constant", "user")
MAX_PACKAGE_BYTES = 16 << 30


class PackageError(ValueError):
    """A package that cannot be loaded, or a call it does not cover (one line, for the user)."""


@dataclass
class GraphInput:
    """One input of the packaged graph, in order."""

    kind: str  # one of INPUT_KINDS
    target: str  # parameter/buffer/constant: its name in the model; user: the argument's name
    index: int = -1  # user: its position among the call's flattened arguments


@dataclass
class Package:
    model: str
    toolchain: dict[str, Any]
    inputs: list[GraphInput]
    in_spec: str  # pytree TreeSpec of (args, kwargs), as JSON
    out_spec: str  # pytree TreeSpec of the result, as JSON
    ranges: dict[str, list[int]]  # symbol -> [lo, hi] the exported graph is valid for
    recipes: list[Recipe]  # one per bucket
    constants: dict[str, Constant] = field(default_factory=dict)  # lifted tensor constants
    weights: dict[str, Constant] = field(default_factory=dict)  # parameters and buffers (--with-weights)
    axes: dict[str, list[int]] = field(default_factory=dict)  # the model file's axes it was built over
    package: int = PACKAGE_VERSION

    def to_bytes(self) -> bytes:
        payload = msgpack.packb(dataclasses.asdict(self), use_bin_type=True)
        return MAGIC + hashlib.sha256(payload).digest() + payload

    @classmethod
    def from_bytes(cls, data: bytes) -> "Package":
        """The package in ``data``, checked; RecipeFormatError if it is damaged or not one."""
        head, digest, payload = data[:len(MAGIC)], data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
        if head != MAGIC:
            raise RecipeFormatError("not a recipe package (bad magic)")
        if hashlib.sha256(payload).digest() != digest:
            raise RecipeFormatError("damaged: checksum mismatch")
        return versioned(cls, unpack(payload), "package", PACKAGE_VERSION, "package", "package")

    def check(self, where: str = "package") -> None:
        if not self.recipes:
            raise RecipeFormatError(f"{where}: no recipes")
        first = self.recipes[0]
        for i, recipe in enumerate(self.recipes):
            recipe.check(f"{where}.recipes[{i}]")
            if (recipe.input_names, recipe.symbols) != (first.input_names, first.symbols):
                raise RecipeFormatError(f"{where}.recipes[{i}]: not a bucket of the same graph")
        if len(self.inputs) != len(first.inputs):
            raise RecipeFormatError(f"{where}: {len(self.inputs)} inputs described, the graph takes {len(first.inputs)}")
        for gi in self.inputs:
            if gi.kind not in INPUT_KINDS:
                raise RecipeFormatError(f"{where}: input kind {gi.kind!r:.20}")
        if set(self.ranges) != set(first.symbols) or not all(
                len(r) == 2 and all(type(v) is int for v in r) for r in self.ranges.values()):
            raise RecipeFormatError(f"{where}: ranges do not match the graph's symbols")


def toolchain() -> dict[str, Any]:
    """What a package must have been built with to run here."""
    return dict(keyparts.toolchain(), package_format=PACKAGE_VERSION)


def check_toolchain(package: Package, path: str | os.PathLike) -> None:
    """PackageError naming both fingerprints if ``package`` was built by another toolchain."""
    ours = toolchain()
    if package.toolchain != ours:
        raise PackageError(f"{path}: built with {fingerprint(package.toolchain)}, this is {fingerprint(ours)}; "
                           "rebuild the package here")


def fingerprint(tc: dict[str, Any]) -> str:
    return " ".join(f"{k}={tc.get(k)}" for k in ("torch", "hpu_backend", "recipe_format", "package_format"))


def read_package(path: str | os.PathLike) -> Package:
    """The package in a file, fully checked; PackageError (one line) if it is not a usable one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_PACKAGE_BYTES:
                raise PackageError(f"{path}: {size} bytes is more than a package may hold")
            data = f.read()
    except OSError as e:
        raise PackageError(f"{path}: cannot read the package: {e.strerror or e}") from None
    try:
        return Package.from_bytes(data)
    except RecipeFormatError as e:
        raise PackageError(f"{path}: not a usable recipe package ({e})") from None


def describe(package: Package) -> dict[str, Any]:
    """What ``hpurecipe show`` prints for a package."""
    first = package.recipes[0]
    return {"kind": "package", "model": package.model, "toolchain": package.toolchain, "axes": package.axes,
            "inputs": {k: sum(gi.kind == k for gi in package.inputs) for k in INPUT_KINDS},
            "with_weights": bool(package.weights), "symbols": first.symbols, "ranges": package.ranges,
            "buckets": [{"bucket": r.bucket, "nodes": len(r.nodes),
                         "time_s": r.facts.get("cost", {}).get("total_s"),
                         "peak_hbm_bytes": r.facts.get("memory", {}).get("peak_bytes")} for r in package.recipes]}

