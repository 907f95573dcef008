"""Precompiled artifacts (``torch.compile(...).aot_compile`` with hpu_backend): the signed file and its fingerprint.

torch saves an aot-compiled function with pickle, and unpickling runs code. So the file this project
writes around torch's bytes is the magic number, the payload's SHA-256, an HMAC-SHA256 tag of that digest
under ``HPURECIPE_BUNDLE_KEY`` (zeros: unsigned) and a msgpack payload ``{"info": {...}, "size": n,
"torch": zlib bytes}``: torch's pickle (which holds our own msgpack part) compressed, ``n`` bytes once inflated.
The header, checksum and signature are checked, in chunks, before any byte of ``torch`` is inflated (never
past ``n``, itself capped: a signed bomb cannot exhaust memory) and handed to torch's unpickler; ``info`` (the
fingerprint, the program key, the recipe keys, the ranges it was built
for) is plain data that ``hpurecipe ls``/``show``/``verify`` read without torch. The fingerprint holds
everything that must be equal where the artifact is loaded; a difference is refused naming the field.
"""

from __future__ import annotations

import json
import os
import platform
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import msgpack

from recipecache.signing import KEY_ENV, sign, signing_key, verify

from .. import envs
from ..errors import HpuBackendError
from . import keyparts, signed
from .recipe import RecipeFormatError, unpack
from .signed import open_regular

MAGIC = b"HPUAOT\x00\x02"  # the last byte versions the format (2: torch's part compressed)
HEADER_BYTES = signed.header_bytes(MAGIC)
UNSIGNED = signed.UNSIGNED
MAX_ARTIFACT_BYTES = 16 << 30
MAX_INFLATED_BYTES = 1 << 30  # torch's part once inflated: its pickle is read whole into memory
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20
TRUST_UNSIGNED_ENV = "HPURECIPE_TRUST_UNSIGNED"  # "1": load unsigned artifacts (local files one built oneself)
FINGERPRINT_FIELDS = ("torch", "python", "hpu_backend", "recipe_format", "target", "settings", "world_size",
                      "accelerator")
NO_ACCELERATOR = "none"


class PrecompileError(HpuBackendError, ValueError):
    """A precompiled artifact that cannot be built or loaded here (one line, naming what is wrong)."""


def fingerprint(key_settings: Mapping[str, Any], world_size: int, accelerator: str) -> dict[str, Any]:
    """What must be equal where an artifact is loaded: versions, the target, the recipe-changing settings,
    the world size (``key_settings``: ``Settings.key_fields()``) and the accelerator Dynamo saw (with one,
    its bytecode reads that device's current stream, which a process without it cannot answer)."""
    settings = {k: v for k, v in key_settings.items() if k != "target"}
    tc = keyparts.toolchain()
    return {"torch": tc["torch"], "python": platform.python_version(), "hpu_backend": tc["hpu_backend"],
            "recipe_format": tc["recipe_format"], "target": key_settings.get("target"),
            "settings": json.loads(json.dumps(settings, sort_keys=True)), "world_size": world_size,
            "accelerator": accelerator}


def check_fingerprint(stored: Any, here: Mapping[str, Any], where: str) -> None:
    """PrecompileError naming the first field of ``stored`` that differs from ``here``."""
    if not isinstance(stored, dict):
        raise PrecompileError(f"{where}: no fingerprint")
    for name in FINGERPRINT_FIELDS:
        if name == "accelerator" and stored.get(name) == NO_ACCELERATOR:
            continue  # captured without one: its bytecode and guards read no device state the host lacks
        if stored.get(name) != here.get(name):
            raise PrecompileError(f"{where}: built for {name}={_short(stored.get(name))}, this process has "
                                  f"{name}={_short(here.get(name))}; precompile it again here")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:119] + "…"


@dataclass
class Artifact:
    info: dict[str, Any]  # plain data: fingerprint, program key, recipe keys, ranges, sizes
    torch_bytes: bytes = field(repr=False)  # torch's pickle, inflated: only unpickled after the header checks out
    signed: bool = False
    digest: str = ""  # the payload's SHA-256 (hex), as the manifest lists it
    size: int = 0  # of the file


def artifact_bytes(info: dict[str, Any], torch_bytes: bytes, key: bytes | None) -> bytes:
    """The file's bytes, signed with ``key`` if given (the signature covers the stored, compressed bytes)."""
    payload = msgpack.packb({"info": info, "size": len(torch_bytes), "torch": zlib.compress(torch_bytes, 6)},
                            use_bin_type=True)
    return framed(payload, key)


def framed(payload: bytes, key: bytes | None) -> bytes:
    """Magic, the payload's digest, its signature (zeros without ``key``), then the payload."""
    return signed.framed(MAGIC, payload, key)


def trust_unsigned(environ: Mapping[str, str] | None = None) -> bool:
    return envs.get(TRUST_UNSIGNED_ENV, environ)


def read_artifact(path: str | os.PathLike, key: bytes | None | bool = True, allow_unsigned: bool | None = None
                  ) -> Artifact:
    """The artifact in a file, its signature checked before its payload is parsed; PrecompileError (one line).

    ``key``: by default ``HPURECIPE_BUNDLE_KEY``. An unsigned artifact is refused unless ``allow_unsigned``
    (default: ``HPURECIPE_TRUST_UNSIGNED=1``), because what torch stores in it is a pickle, and unpickling runs
    code: only trust an unsigned file you built yourself.
    """
    path = Path(path)
    key = signing_key() if key is True else key
    allow_unsigned = trust_unsigned() if allow_unsigned is None else allow_unsigned
    policy = signed.Policy(unsigned=allow_unsigned, unchecked=allow_unsigned)
    try:
        checked = signed.read_signed(path, MAGIC, key, policy, MAX_ARTIFACT_BYTES)
    except OSError as e:
        raise PrecompileError(f"{path}: cannot read the artifact: {e.strerror or e}") from None
    except signed.SignedFileError as e:
        raise PrecompileError(f"{path}: {_refusal(e)}") from None
    except ValueError as e:  # not a regular file
        raise PrecompileError(f"{path}: {e}") from None
    return _parse(path, checked.payload, checked.signed, checked.digest.hex(), checked.size)


def _refusal(e: signed.SignedFileError) -> str:
    """A refusal of the signed-file reader in an artifact's words."""
    return {
        "magic": "not a precompiled hpu_backend artifact (bad magic; an artifact saved by torch alone, or for "
                 "another backend, is not loaded)",
        "version": f"artifact format {e.detail}, this reads {MAGIC[-1]}: precompile again",
        "size": f"{e.detail} bytes is more than an artifact may hold",
        "checksum": "damaged or truncated: checksum mismatch",
        "changed": "changed while being read",
        "unsigned": f"not signed; set {KEY_ENV} when precompiling (or, for a file you built yourself, "
                    f"{TRUST_UNSIGNED_ENV}=1)",
        "unchecked": f"signed, but {KEY_ENV} is not set here to check it",
        "signature": f"the signature does not match: changed after signing, or signed with another key than "
                     f"{KEY_ENV}",
    }[e.reason]


def _parse(path: Path, payload: bytes, is_signed: bool, digest: str, size: int) -> Artifact:
    try:
        raw = unpack(payload)
    except RecipeFormatError as e:
        raise PrecompileError(f"{path}: {e}") from None
    if not (isinstance(raw, dict) and isinstance(raw.get("info"), dict) and isinstance(raw.get("torch"), bytes)
            and isinstance(raw.get("size"), int)):
        raise PrecompileError(f"{path}: not a precompiled artifact's payload")
    check_info(raw["info"], str(path))
    return Artifact(raw["info"], inflate(raw["torch"], raw["size"], str(path)), is_signed, digest, size)


def inflate(data: bytes, size: int, where: str, cap: int = MAX_INFLATED_BYTES) -> bytes:
    """``data`` decompressed, refused (one line) unless it is exactly the ``size`` declared, ``size`` ≤ ``cap``:
    never more than ``size`` + 1 bytes are produced, whatever ``data`` holds."""
    if not 0 <= size <= cap:
        raise PrecompileError(f"{where}: declares {size} bytes once inflated, more than the {cap} an artifact may hold")
    unzip = zlib.decompressobj()
    try:
        out = unzip.decompress(data, size + 1)
    except zlib.error as e:
        raise PrecompileError(f"{where}: torch's part does not inflate ({e})") from None
    if len(out) != size or not unzip.eof or unzip.unconsumed_tail or unzip.unused_data:
        raise PrecompileError(f"{where}: torch's part does not inflate to the {size} bytes it declares")
    return out


INFO_FIELDS = {"fingerprint": dict, "program": str, "recipes": list, "mode": str, "model": str, "ranges": dict,
               "recipe_bytes": int}


def check_info(info: dict, where: str) -> None:
    for name, kind in INFO_FIELDS.items():
        if not isinstance(info.get(name), kind):
            raise PrecompileError(f"{where}: its description lacks {name!r}")


def describe(artifact: Artifact, path: str | os.PathLike) -> dict[str, Any]:
    """What ``hpurecipe show`` prints for an artifact."""
    info = artifact.info
    return {"kind": "precompiled", "path": str(path), "model": info["model"], "mode": info["mode"],
            "signed": artifact.signed, "fingerprint": info["fingerprint"], "program": info["program"],
            "ranges": info["ranges"], "serves": info.get("serves") if _pairs_table(info.get("serves")) else None,
            "recipes": info["recipes"], "recipe_bytes": info["recipe_bytes"],
            "bytes": artifact.size}


# -- the directory: one artifact per bucket range, and a signed manifest ---------------------------------

def manifest_bytes(doc: dict[str, Any], key: bytes | None) -> bytes:
    """The manifest file: ``doc`` with an HMAC of its canonical JSON (empty: unsigned)."""
    body = json.dumps(doc, sort_keys=True).encode()
    tag = sign(key, [MAGIC, body]).hex() if key else ""
    return json.dumps({"manifest": doc, "signature": tag}, indent=1, sort_keys=True).encode()


def read_manifest(directory: str | os.PathLike, key: bytes | None | bool = True,
                  allow_unsigned: bool | None = None) -> dict[str, Any]:
    """The manifest of a precompiled directory, its signature checked; PrecompileError (one line)."""
    path = Path(directory) / MANIFEST
    key = signing_key() if key is True else key
    allow_unsigned = trust_unsigned() if allow_unsigned is None else allow_unsigned
    try:
        with open_regular(path) as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise PrecompileError("too large for a manifest")
        outer = json.loads(data)
    except FileNotFoundError:
        raise PrecompileError(f"{directory}: no {MANIFEST}: not a precompiled directory") from None
    except OSError as e:
        raise PrecompileError(f"{path}: cannot read it: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise PrecompileError(f"{path}: not a manifest ({str(e)[:100]})") from None
    doc = _checked_manifest(outer, path)
    _check_manifest_signature(outer, doc, key, allow_unsigned, path)
    return doc


def _checked_manifest(outer: Any, path: Path) -> dict[str, Any]:
    doc = outer.get("manifest") if isinstance(outer, dict) else None
    if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
        raise PrecompileError(f"{path}: not a version-{MANIFEST_VERSION} precompiled manifest")
    arts = doc.get("artifacts")
    if not isinstance(arts, list) or not arts or not all(
            isinstance(a, dict) and isinstance(a.get("file"), str) and isinstance(a.get("sha256"), str)
            and isinstance(a.get("ranges"), dict) and _plain_name(a["file"]) for a in arts):
        raise PrecompileError(f"{path}: its artifact list is malformed")
    if not isinstance(doc.get("fingerprint"), dict) or not isinstance(doc.get("parameters"), dict):
        raise PrecompileError(f"{path}: it lacks the fingerprint or the parameters")
    checks = [("dims", _pairs_table(doc.get("dims"))), ("modules", _modules(doc.get("modules"))),
              *((f"{a['file']} serves", _pairs_table(a.get("serves"))) for a in arts)]
    bad = next((name for name, ok in checks if not ok), None)
    if bad:
        raise PrecompileError(f"{path}: its {bad} is malformed")
    return doc


def _pairs_table(value: Any) -> bool:
    """Absent (an older manifest), or axis -> list of [int, int] (a served span, or an input's dimension)."""
    return value is None or isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p) for p in v)
        for k, v in value.items())


def _modules(value: Any) -> bool:
    """Absent, or {"classes": {name: class}, "hooks": {name: {kind: [function names]}}}."""
    if value is None:
        return True
    if not (isinstance(value, dict) and isinstance(value.get("classes"), dict)
            and isinstance(value.get("hooks"), dict)):
        return False
    return all(isinstance(k, str) and isinstance(v, str) for k, v in value["classes"].items()) and all(
        isinstance(k, str) and isinstance(v, dict) and all(
            isinstance(kind, str) and isinstance(fns, list) and all(isinstance(f, str) for f in fns)
            for kind, fns in v.items()) for k, v in value["hooks"].items())


def _plain_name(name: str) -> bool:
    """A file name inside the directory (no separator, no parent): a manifest never points elsewhere."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _check_manifest_signature(outer: dict, doc: dict, key: bytes | None, allow_unsigned: bool, path: Path) -> None:
    tag = outer.get("signature")
    if not tag:
        if allow_unsigned:
            return
        raise PrecompileError(f"{path}: not signed; set {KEY_ENV} when precompiling (or, for files you built "
                              f"yourself, {TRUST_UNSIGNED_ENV}=1)")
    if key is None:
        if allow_unsigned:
            return
        raise PrecompileError(f"{path}: signed, but {KEY_ENV} is not set here to check it")
    body = json.dumps(doc, sort_keys=True).encode()
    try:
        ok = verify(key, [MAGIC, body], bytes.fromhex(tag))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PrecompileError(f"{path}: the signature does not match: changed after signing, or signed with "
                              f"another key than {KEY_ENV}")


def is_precompiled(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a precompiled directory (has a manifest) or an artifact file (its magic)."""
    p = Path(path)
    if p.is_dir():
        return (p / MANIFEST).is_file()
    try:
        with open_regular(p) as f:  # never blocks on a FIFO
            return f.read(len(MAGIC) - 1) == MAGIC[:-1]
    except (OSError, ValueError):
        return False
