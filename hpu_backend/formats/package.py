"""Recipe packages: one file that serves a model's warmed buckets with no trace at all — its data format.

A package (built by ``hpurecipe package``, see shipping/package.py) holds an exported inference graph
lowered to one recipe per shape bucket, the input/output contract (which graph inputs are the
model's parameters, buffers and constants, and the pytree layout of the call's arguments and
results), the ranges its shape symbols may take, and the toolchain it was built with;
optionally the weights. It is msgpack data, checked like a recipe. This module does not import
torch (``hpurecipe show``/``ls`` read packages without it); runtime/packaged.py serves them.

The call layouts are our own plain trees (``None`` a leaf, ``["tuple", [...]]``, ``["list", [...]]``,
``["dict", [keys], [...]]``, ``["record", [keys], [...]]`` for a result class that is a mapping of named
fields, such as a Hugging Face ``ModelOutput``, served back as a dict with attribute access), never a type
name for a deserializer to import. The file is the magic
number, the payload's SHA-256, an HMAC-SHA256 tag of that digest under ``HPURECIPE_BUNDLE_KEY`` (zeros
when built without a key) and the payload; it is read from regular files only, hashed in chunks before
the payload is held in memory.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from recipecache.signing import KEY_ENV, signing_key

from . import keyparts, signed
from .recipe import Constant, Recipe, RecipeFormatError, unpack, versioned
from ..errors import HpuBackendError

PACKAGE_VERSION = 2
MAGIC = b"HPUPKG\x00\x02"  # then the payload's sha256, the signature tag (zeros: unsigned), the msgpack payload
HEADER_BYTES = signed.header_bytes(MAGIC)
UNSIGNED = signed.UNSIGNED
INPUT_KINDS = ("parameter", "buffer", "constant", "user")
MAX_PACKAGE_BYTES = 16 << 30
LAYOUT_KINDS = ("tuple", "list", "dict", "record")
KEYED_KINDS = ("dict", "record")  # [kind, keys, children]
MAX_LAYOUT_NODES = 10_000
MAX_LAYOUT_DEPTH = 32


class PackageError(HpuBackendError, ValueError):
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
    in_spec: Any  # call layout of (args, kwargs): a plain tree (see ``check_layout``)
    out_spec: Any  # call layout of the result
    ranges: dict[str, list[int]]  # symbol -> [lo, hi] the exported graph is valid for
    recipes: list[Recipe]  # one per bucket
    constants: dict[str, Constant] = field(default_factory=dict)  # lifted tensor constants
    weights: dict[str, Constant] = field(default_factory=dict)  # parameters and buffers (--with-weights)
    axes: dict[str, list[int]] = field(default_factory=dict)  # the model file's axes it was built over
    package: int = PACKAGE_VERSION

    def to_bytes(self, key: bytes | None = None) -> bytes:
        """The package file's bytes, signed with ``key`` if given."""
        return signed.framed(MAGIC, msgpack.packb(dataclasses.asdict(self), use_bin_type=True), key)

    @classmethod
    def from_bytes(cls, data: bytes, key: bytes | None = None) -> "Package":
        """The package in ``data``, checked; RecipeFormatError if it is damaged or not one, PackageError if
        ``key`` is given and it is not signed with it."""
        head = signed.header_bytes(MAGIC)
        try:
            digest, _ = signed.check_header(data[:head], MAGIC, key, _policy(key))
            if hashlib.sha256(memoryview(data)[head:]).digest() != digest:
                raise signed.SignedFileError("checksum")
        except signed.SignedFileError as e:
            raise _refused(e) from None
        return cls.from_payload(memoryview(data)[head:])

    @classmethod
    def from_payload(cls, payload: bytes | memoryview) -> "Package":
        """The package in a payload whose file was checked; RecipeFormatError if it is not one."""
        return versioned(cls, unpack(payload), "package", PACKAGE_VERSION, "package", "package")

    def check(self, where: str = "package") -> None:
        if not self.recipes:
            raise RecipeFormatError(f"{where}: no recipes")
        first = self.recipes[0]
        for i, recipe in enumerate(self.recipes):
            recipe.check(f"{where}.recipes[{i}]")
            if (recipe.input_names, recipe.symbols, recipe.symbol_sources, len(recipe.outputs)) != (
                    first.input_names, first.symbols, first.symbol_sources, len(first.outputs)):
                raise RecipeFormatError(f"{where}.recipes[{i}]: not a bucket of the same graph")
        if len(self.inputs) != len(first.inputs):
            raise RecipeFormatError(
                f"{where}: {len(self.inputs)} inputs described, the graph takes {len(first.inputs)}")
        for gi in self.inputs:
            if gi.kind not in INPUT_KINDS:
                raise RecipeFormatError(f"{where}: input kind {gi.kind!r:.20}")
        if any(self.inputs[slot].kind != "user" for slot, _ in first.symbol_sources):
            raise RecipeFormatError(f"{where}: a shape symbol is read from an input that is not the user's")
        self.check_tensors(where)
        if set(self.ranges) != set(first.symbols) or not all(
                len(r) == 2 and all(type(v) is int for v in r) and 0 <= r[0] <= r[1] for r in self.ranges.values()):
            raise RecipeFormatError(f"{where}: ranges do not match the graph's symbols")
        self.check_layouts(where)

    def check_tensors(self, where: str) -> None:
        """Every constant input is stored, and so is every parameter and buffer if any weights are."""
        for gi in self.inputs:
            table = self.constants if gi.kind == "constant" else self.weights if self.weights else None
            if gi.kind != "user" and table is not None and gi.target not in table:
                raise RecipeFormatError(f"{where}: {gi.kind} {gi.target!r:.60} is not stored")

    def check_layouts(self, where: str) -> None:
        """The call layouts are plain trees whose leaves match the graph: every user input is a leaf of the
        call, and the result has one leaf per graph output."""
        leaves = check_layout(self.in_spec, f"{where}.in_spec")
        outputs = check_layout(self.out_spec, f"{where}.out_spec")
        if not (isinstance(self.in_spec, list) and self.in_spec[0] == "tuple" and len(self.in_spec[1]) == 2):
            raise RecipeFormatError(f"{where}.in_spec: not an (args, kwargs) layout")
        users = [gi.index for gi in self.inputs if gi.kind == "user"]
        if sorted(users) != list(range(len(users))) or len(users) > leaves:
            raise RecipeFormatError(f"{where}: user inputs {users!r:.60} are not leaves of the call ({leaves})")
        if outputs != len(self.recipes[0].outputs):
            raise RecipeFormatError(f"{where}.out_spec: {outputs} results, the graph returns "
                                    f"{len(self.recipes[0].outputs)}")


def check_layout(tree: Any, where: str) -> int:
    """The number of leaves of a call layout; RecipeFormatError unless it is a plain tree of bounded size:
    ``None`` (a leaf), ``[kind, children]`` for a tuple or list, ``["dict" | "record", keys, children]`` with
    str keys."""
    count = [0, 0]  # nodes, leaves

    def walk(node: Any, depth: int) -> None:
        count[0] += 1
        if count[0] > MAX_LAYOUT_NODES or depth > MAX_LAYOUT_DEPTH:
            raise RecipeFormatError(f"{where}: more than {MAX_LAYOUT_NODES} nodes or {MAX_LAYOUT_DEPTH} levels")
        if node is None:
            count[1] += 1
            return
        if not (isinstance(node, list) and node and node[0] in LAYOUT_KINDS
                and len(node) == (3 if node[0] in KEYED_KINDS else 2) and isinstance(node[-1], list)):
            raise RecipeFormatError(f"{where}: {node!r:.60} is not a leaf, tuple, list or dict layout")
        if node[0] in KEYED_KINDS and not (isinstance(node[1], list) and len(node[1]) == len(node[2])
                                      and all(isinstance(k,
                                                         str) for k in node[1]) and len(set(node[1])) == len(node[1])):
            raise RecipeFormatError(f"{where}: dict keys {node[1]!r:.60} are not distinct names, one per child")
        if node[0] == "record" and (bad := next((k for k in node[1] if not record_field(k)), None)) is not None:
            raise RecipeFormatError(f"{where}: record field {bad!r:.40} is not a field name (a record reads its "
                                    "fields as attributes; dunder names and a dict's own methods are refused)")
        for child in node[-1]:
            walk(child, depth + 1)

    walk(tree, 0)
    return count[1]


def record_field(name: str) -> bool:
    """Whether ``name`` can be a record's field: an identifier that is neither a dunder name (``__class__``) nor
    an attribute of dict (``keys``, ``items``), since ``out.NAME`` would read that attribute instead of the
    field, or change what the record is."""
    return name.isidentifier() and not name.startswith("__") and not hasattr(dict, name)


def _policy(key: bytes | None) -> signed.Policy:
    """Without a key anything is read (nothing to check it with); with one, only packages signed with it."""
    return signed.Policy(unsigned=key is None, unchecked=True)


def _refused(e: signed.SignedFileError) -> Exception:
    """A refusal of the signed-file reader in a package's words: PackageError for the signature,
    RecipeFormatError for a file that is not (or no longer) a package of this format."""
    if e.reason == "unsigned":
        return PackageError(f"the package is not signed, and {KEY_ENV} is set: only signed packages are accepted; "
                            "rebuild it with the key set")
    if e.reason == "signature":
        return PackageError(f"the signature does not match: the package was changed after signing, or signed "
                            f"with another key than {KEY_ENV}")
    if e.reason == "size":
        return PackageError(f"{e.detail} bytes is more than a package may hold")
    if e.reason == "magic":
        return RecipeFormatError("not a recipe package (bad magic)")
    if e.reason == "version":
        return RecipeFormatError(f"package format {e.detail}, this reads {PACKAGE_VERSION}: rebuild the package")
    return RecipeFormatError("damaged: checksum mismatch")


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


def read_package(path: str | os.PathLike, key: bytes | None | bool = True) -> Package:
    """The package in a file, fully checked; PackageError (one line) if it is not a usable one.

    ``key``: the signing key packages must be signed with; by default ``HPURECIPE_BUNDLE_KEY`` (none set:
    signatures are not checked). The file must be a regular one (a FIFO or a device is refused without
    blocking); its header, size, checksum and signature are checked in chunks before the payload is read
    (``formats.signed``).
    """
    path = Path(path)
    key = signing_key() if key is True else key
    try:
        checked = signed.read_signed(path, MAGIC, key, _policy(key), MAX_PACKAGE_BYTES)
        return Package.from_payload(checked.payload)
    except OSError as e:
        raise PackageError(f"{path}: cannot read the package: {e.strerror or e}") from None
    except signed.SignedFileError as e:
        refused = _refused(e)
        if isinstance(refused, PackageError):
            raise PackageError(f"{path}: {refused}") from None
        raise PackageError(f"{path}: not a usable recipe package ({refused})") from None
    except RecipeFormatError as e:
        raise PackageError(f"{path}: not a usable recipe package ({e})") from None
    except ValueError as e:  # not a regular file
        raise PackageError(f"{path}: {e}") from None


def check_destination(path: str | os.PathLike) -> None:
    """PackageError if ``path`` exists and is not a regular file (a device or a FIFO is never replaced), or its
    directory does not exist: a package is written where the caller points, never into directories made for it
    (as ``export`` refuses the same path)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = Path(path).parent
        if not parent.is_dir():
            raise PackageError(f"cannot write {path}: there is no directory {parent}") from None
        return
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            raise PackageError(f"{path}: a parent is not a directory") from None
        raise PackageError(f"{path}: cannot write the package: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise PackageError(f"{path}: exists and is not a regular file; choose another destination")


def served(package: Package) -> dict[str, list[list[int]]]:
    """Per symbol, the sizes a call may have: the buckets' spans within the range export proved, adjacent spans
    merged. The range alone claims too much: a size between two buckets is refused (no recipe holds it)."""
    out = {}
    for sym, (lo, hi) in package.ranges.items():
        spans: list[list[int]] = []
        for a, b in sorted({tuple(r.bucket[sym]) for r in package.recipes if sym in r.bucket}):
            a, b = max(a, lo), min(b, hi)
            if a > b:
                continue
            if spans and a <= spans[-1][1] + 1:
                spans[-1][1] = max(spans[-1][1], b)
            else:
                spans.append([a, b])
        out[sym] = spans
    return out


def describe(package: Package) -> dict[str, Any]:
    """What ``hpurecipe show`` prints for a package."""
    first = package.recipes[0]
    return {"kind": "package", "model": package.model, "toolchain": package.toolchain, "axes": package.axes,
            "inputs": {k: sum(gi.kind == k for gi in package.inputs) for k in INPUT_KINDS},
            "with_weights": bool(package.weights), "symbols": first.symbols, "ranges": package.ranges,
            "serves": served(package),
            "buckets": [{"bucket": r.bucket, "nodes": len(r.nodes),
                         "time_s": r.facts.get("cost", {}).get("total_s"),
                         "peak_hbm_bytes": r.facts.get("memory", {}).get("peak_bytes")} for r in package.recipes]}

