"""Precompiled artifacts (``torch.compile(...).aot_compile`` with hpu_backend): the signed file and its fingerprint.

torch saves an aot-compiled function with pickle, and unpickling runs code. So the file this project
writes around torch's bytes is the magic number, the payload's SHA-256, an HMAC-SHA256 tag of that digest
and a msgpack payload ``{"info": {...}, "size": n, "torch": zlib bytes}``: torch's pickle (which holds our
own msgpack part) compressed, ``n`` bytes once inflated. Every artifact and manifest is signed, with the team
key ``HPURECIPE_BUNDLE_KEY`` when it is set, else with this user's own key (``recipecache.signing``), and is
loaded only when that same key checks it here: an unsigned one, or one signed with a key not available here,
is refused. The header, checksum and signature are checked, in chunks, before any byte of ``torch`` is
inflated (never past ``n``, itself capped: a signed bomb cannot exhaust memory) and handed to torch's
unpickler; ``info`` (the fingerprint, the program key, the recipe keys, the ranges it was built for, which
key signed it: its kind and id, never the key) is plain data that ``hpurecipe ls``/``show`` list without
torch or a key. The fingerprint holds everything that must be equal where the artifact is loaded; a
difference is refused naming the field.
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

from recipecache.signing import (KEY_ENV, MACHINE, TEAM, Signer, SigningKeyError, key_id, machine_key, own_signer,
                                sign, verify)

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
STRICT = signed.Policy(unsigned=False, unchecked=False)  # loading: signed, and checked with the key here
LISTING = signed.Policy(unsigned=True, unchecked=True)  # listing: plain info only, torch's part never inflated
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
    torch_bytes: bytes = field(repr=False)  # torch's pickle, inflated only once the signature checks out ("": listed)
    signed: bool = False  # its signature was checked with the key here
    digest: str = ""  # the payload's SHA-256 (hex), as the manifest lists it
    size: int = 0  # of the file
    signature: str = ""  # in words: checked with which key, or why not (what ``ls``/``show`` say)


def artifact_bytes(info: dict[str, Any], torch_bytes: bytes, key: bytes | None) -> bytes:
    """The file's bytes, signed with ``key`` if given (the signature covers the stored, compressed bytes)."""
    payload = msgpack.packb({"info": info, "size": len(torch_bytes), "torch": zlib.compress(torch_bytes, 6)},
                            use_bin_type=True)
    return framed(payload, key)


def framed(payload: bytes, key: bytes | None) -> bytes:
    """Magic, the payload's digest, its signature (zeros without ``key``), then the payload."""
    return signed.framed(MAGIC, payload, key)


def read_artifact(path: str | os.PathLike, signer: Signer | None | bool = True, *, listing: bool = False
                  ) -> Artifact:
    """The artifact in a file, its signature checked before its payload is parsed; PrecompileError (one line).

    ``signer``: the key it must be signed with, by default the team key ``HPURECIPE_BUNDLE_KEY`` if set, else this
    user's own key. An unsigned artifact, or one signed with another key, is always refused: what torch stores
    in it is a pickle, and unpickling runs code. ``listing``: read the plain info only, whatever signed it (its
    checksum is checked, its signature checked if a key is here and reported in ``signature``); torch's part is
    left out (``torch_bytes`` empty), so a listed artifact can never reach the unpickler.
    """
    path = Path(path)
    signer = own_signer() if signer is True else signer
    key = signer.key if signer else None
    try:
        checked = signed.read_signed(path, MAGIC, None if listing else key, LISTING if listing else STRICT,
                                     MAX_ARTIFACT_BYTES)
    except OSError as e:
        raise PrecompileError(f"{path}: cannot read the artifact: {e.strerror or e}") from None
    except signed.SignedFileError as e:
        if e.reason in ("unsigned", "unchecked", "signature"):
            raise PrecompileError(f"{path}: {untrusted(e.reason, _recorded_signer(path), signer)}") from None
        raise PrecompileError(f"{path}: {_refusal(e)}") from None
    except ValueError as e:  # not a regular file
        raise PrecompileError(f"{path}: {e}") from None
    artifact = _parse(path, checked.payload, checked.signed, checked.digest.hex(), checked.size, listing)
    if listing:
        artifact.signed = checked.tag != signed.UNSIGNED and key is not None and verify(
            key, [MAGIC, checked.digest], checked.tag)
        artifact.signature = signature_words(artifact.signed, checked.tag == signed.UNSIGNED,
                                             artifact.info.get("signer"), signer)
    else:
        artifact.signature = signature_words(True, False, artifact.info.get("signer"), signer)
    return artifact


def _refusal(e: signed.SignedFileError) -> str:
    """A refusal of the signed-file reader in an artifact's words."""
    return {
        "magic": "not a precompiled hpu_backend artifact (bad magic; an artifact saved by torch alone, or for "
                 "another backend, is not loaded)",
        "version": f"artifact format {e.detail}, this reads {MAGIC[-1]}: precompile again",
        "size": f"{e.detail} bytes is more than an artifact may hold",
        "checksum": "damaged or truncated: checksum mismatch",
        "changed": "changed while being read",
    }[e.reason]


def _recorded_signer(path: Path) -> Any:
    """The signer an artifact's info names (plain msgpack, read for a refusal's words only), or None."""
    try:
        raw = unpack(signed.read_signed(path, MAGIC, None, LISTING, MAX_ARTIFACT_BYTES).payload)
        return raw["info"].get("signer")
    except Exception:  # noqa: BLE001 (any failure: the refusal just names no signer)
        return None


# -- which key signed, in words ---------------------------------------------------------------------------

WHAT_TO_DO = f"precompile it here, or set the same team key {KEY_ENV} when precompiling and when loading"


def _recorded(record: Any) -> tuple[str, str] | None:
    if isinstance(record, dict) and record.get("kind") in (TEAM, MACHINE) and isinstance(record.get("id"), str):
        return record["kind"], record["id"][:16]
    return None


def signer_words(record: Any) -> str:
    """Who signed, as an artifact or manifest records it (unchecked: for messages only)."""
    recorded = _recorded(record)
    if recorded is None:
        return "another key (it does not say which)"
    kind, ident = recorded
    return f"a team key {KEY_ENV} (id {ident})" if kind == TEAM else f"a machine's own key (id {ident})"


def _ours(signer: Signer) -> str:
    return f"{KEY_ENV} (id {signer.id})" if signer.kind == TEAM else f"this machine's own key (id {signer.id})"


def untrusted(reason: str, record: Any, signer: Signer | None) -> str:
    """Why a file is not loaded (``reason``: unsigned, unchecked or signature), and what to do, in one line."""
    if reason == "unsigned":
        return ("not signed, and unsigned precompiled files are never loaded (torch's part is a pickle: loading "
                "it runs code); precompile it again (hpurecipe precompile signs what it writes)")
    recorded = _recorded(record)
    if reason == "signature" and signer is not None and recorded is not None and recorded[1] == signer.id:
        return "the signature does not match: changed after signing; precompile it again"
    if (signer is not None and signer.kind == TEAM and recorded is not None and recorded[0] == MACHINE):
        try:
            mine = machine_key()
        except SigningKeyError:  # an unusable key file: the general advice stands
            mine = None
        if mine is not None and key_id(mine) == recorded[1]:
            return (f"signed with this machine's own key (id {recorded[1]}), and {KEY_ENV} is set: unset it to "
                    f"load this, or precompile it again with {KEY_ENV} set")
    if signer is None:
        return (f"signed with {signer_words(record)}, and there is no key here to check it ({KEY_ENV} is not set, "
                f"and this machine has no key of its own yet); {WHAT_TO_DO}")
    return f"the signature does not match: signed with {signer_words(record)}, not with {_ours(signer)}; {WHAT_TO_DO}"


def signature_words(checked: bool, unsigned: bool, record: Any, signer: Signer | None) -> str:
    """What a listing says of a file's signature."""
    if checked and signer is not None:
        return f"checked with {_ours(signer)}"
    if unsigned:
        return "unsigned: never loaded"
    return f"signed with {signer_words(record)}; not checked: no matching key here"


def _parse(path: Path, payload: bytes, is_signed: bool, digest: str, size: int, listing: bool = False) -> Artifact:
    try:
        raw = unpack(payload)
    except RecipeFormatError as e:
        raise PrecompileError(f"{path}: {e}") from None
    if not (isinstance(raw, dict) and isinstance(raw.get("info"), dict) and isinstance(raw.get("torch"), bytes)
            and isinstance(raw.get("size"), int)):
        raise PrecompileError(f"{path}: not a precompiled artifact's payload")
    check_info(raw["info"], str(path))
    torch_bytes = b"" if listing else inflate(raw["torch"], raw["size"], str(path))
    return Artifact(raw["info"], torch_bytes, is_signed, digest, size)


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
            "signed": artifact.signed, "signature": artifact.signature, "fingerprint": info["fingerprint"],
            "program": info["program"],
            "ranges": info["ranges"], "serves": info.get("serves") if _pairs_table(info.get("serves")) else None,
            "recipes": info["recipes"], "recipe_bytes": info["recipe_bytes"],
            "bytes": artifact.size}


# -- the directory: one artifact per bucket range, and a signed manifest ---------------------------------

def manifest_bytes(doc: dict[str, Any], key: bytes | None) -> bytes:
    """The manifest file: ``doc`` with an HMAC of its canonical JSON (empty: unsigned, never loaded)."""
    body = json.dumps(doc, sort_keys=True).encode()
    tag = sign(key, [MAGIC, body]).hex() if key else ""
    return json.dumps({"manifest": doc, "signature": tag}, indent=1, sort_keys=True).encode()


def read_manifest(directory: str | os.PathLike, signer: Signer | None | bool = True, *,
                  listing: bool = False) -> dict[str, Any]:
    """The manifest of a precompiled directory, its signature checked (``signer``: as for ``read_artifact``);
    PrecompileError (one line). ``listing``: its plain data whatever signed it, for ``ls`` and ``show``."""
    path = Path(directory) / MANIFEST
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
    if not listing:
        _check_manifest_signature(outer, doc, own_signer() if signer is True else signer, path)
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


def _check_manifest_signature(outer: dict, doc: dict, signer: Signer | None, path: Path) -> None:
    tag = outer.get("signature")
    if not tag:
        raise PrecompileError(f"{path}: {untrusted('unsigned', None, signer)}")
    if signer is None:
        raise PrecompileError(f"{path}: {untrusted('unchecked', doc.get('signer'), signer)}")
    body = json.dumps(doc, sort_keys=True).encode()
    try:
        ok = verify(signer.key, [MAGIC, body], bytes.fromhex(tag))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PrecompileError(f"{path}: {untrusted('signature', doc.get('signer'), signer)}")


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
