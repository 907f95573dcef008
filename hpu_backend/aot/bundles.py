"""Bundles: one tar file of cache entries (their own checksummed format), manifests and the toolchain.

Layout: ``bundle.json`` (format, toolchain, entry list), ``entries/<key>.rcp`` (each entry exactly
as the cache encodes it: header, payload, checksum), ``manifests/<name>.json`` and, when signed,
``bundle.sig``. Reading never extracts to disk, accepts only those names and regular files within
size limits checked from their headers, and checks every entry's checksum and that its payload is a
recipe before anything is imported. No pickle anywhere.

Signing (optional): with a key (``HPURECIPE_BUNDLE_KEY``), ``bundle.sig`` holds an HMAC-SHA256 over
every other member's name and SHA-256; a reader given a key accepts only a bundle whose signature
matches it.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipecache import CorruptEntry, Entry, RecipeCache, decode_entry, encode_entry
from recipecache.signing import KEY_ENV, signing_key

from ..formats.keyparts import toolchain
from ..errors import one_line
from ..formats.program import parse_payload
from ..formats.recipe import RecipeFormatError

BUNDLE_FORMAT = "hpurecipe-bundle"
BUNDLE_VERSION = 1
_ENTRY = re.compile(r"entries/([0-9A-Za-z_-]{1,128})\.rcp")
_MANIFEST = re.compile(r"manifests/([0-9A-Za-z_.-]{1,200}\.json)")
MAX_MEMBER = 64 * 1024**2  # one entry or manifest (a recipe is KBs to a few MB)
MAX_BUNDLE = 4 * 1024**3  # all members together
SIGNATURE = "bundle.sig"


def bundle_key(environ=None) -> bytes | None:
    """The signing key from the environment, or None (``recipecache.signing``: one key for all shipped data)."""
    return signing_key(environ)


class BundleError(ValueError):
    """A bundle that is not ours, is damaged, unsigned or signed with another key, or from another toolchain."""


@dataclass
class Bundle:
    info: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    manifests: dict[str, dict] = field(default_factory=dict)
    signed: bool = False  # its signature was checked against a key


def write_bundle(path: Path, cache: RecipeCache, keys: list[str], manifests: dict[str, dict],
                 key: bytes | None = None) -> dict[str, Any]:
    """Write the entries under ``keys`` (read without counting hits) and ``manifests`` to a tar file,
    signed with ``key`` if given."""
    entries = [e for e in (cache.peek(k) for k in keys) if e is not None]
    info = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "toolchain": toolchain(), "created": time.time(),
            "entries": [{"key": e.key, "model": e.meta.get("model", ""), "graph": e.meta.get("graph", "")}
                        for e in entries], "manifests": sorted(manifests)}
    if not path.parent.is_dir():
        raise BundleError(f"cannot write {path}: there is no directory {path.parent}")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        members = {"bundle.json": json.dumps(info, indent=1, sort_keys=True).encode()}
        members.update({f"entries/{e.key}.rcp": encode_entry(e.key, e.payload, e.meta, e.created) for e in entries})
        members.update({f"manifests/{name}": json.dumps(doc, indent=1, sort_keys=True).encode()
                        for name, doc in sorted(manifests.items())})
        if key is not None:
            members[SIGNATURE] = _signature(key, {n: hashlib.sha256(d).digest() for n, d in members.items()})
        with tarfile.open(tmp, "w") as tar:
            for name, data in members.items():
                _add(tar, name, data)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write {path}: {e.strerror or e}") from None
    return info


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = len(data), int(time.time()), 0o600
    tar.addfile(member, io.BytesIO(data))


def _signature(key: bytes, digests: dict[str, bytes]) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for name in sorted(digests):
        mac.update(name.encode() + b"\0" + digests[name])
    return mac.hexdigest().encode()


def read_bundle(path: Path, key: bytes | None = None) -> Bundle:
    """Read and check a whole bundle (BundleError on anything unexpected); nothing touches the disk.
    With ``key``, the bundle must be signed with it."""
    try:
        tar = tarfile.open(path, "r:*")
    except OSError as e:
        raise BundleError(f"cannot read {path}: {e.strerror or e}") from None
    except tarfile.TarError:
        raise BundleError(f"{path}: not a bundle (not a tar file, plain or compressed)") from None
    with tar:
        files = _members(path, tar)
        if "bundle.json" not in files:
            raise BundleError(f"{path}: not an hpurecipe bundle (no bundle.json)")
        data = {name: _read(tar, member) for name, member in files.items()}
    _check_signature(path, data, key)
    bundle = Bundle(_info(path, data["bundle.json"]), signed=key is not None)
    for name, content in data.items():
        if (m := _ENTRY.fullmatch(name)) is not None:
            bundle.entries.append(_entry(path, m.group(1), content))
        elif (m := _MANIFEST.fullmatch(name)) is not None:
            bundle.manifests[m.group(1)] = _json(path, name, content)
        elif name not in ("bundle.json", SIGNATURE):
            raise BundleError(f"{path}: unexpected member {name!r}")
    return bundle


def _check_signature(path: Path, data: dict[str, bytes], key: bytes | None) -> None:
    if key is None:
        return
    if SIGNATURE not in data:
        raise BundleError(f"{path}: the bundle is not signed, and {KEY_ENV} is set: only signed bundles are "
                          "imported (export it again with the key set)")
    digests = {n: hashlib.sha256(d).digest() for n, d in data.items() if n != SIGNATURE}
    if not hmac.compare_digest(_signature(key, digests), data[SIGNATURE].strip()):
        raise BundleError(f"{path}: the signature does not match: the bundle was changed after signing, or "
                          f"signed with another key than {KEY_ENV}")


def _members(path: Path, tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The members by name, each checked by its header (a regular file within the size limits) before
    the next is looked at, so that a forged size is refused before anything is read or inflated."""
    files, total = {}, 0
    try:
        for member in tar:
            total += member.size
            if not member.isfile():
                raise BundleError(f"{path}: member {member.name!r} is not a regular file")
            if member.size > MAX_MEMBER:
                raise BundleError(f"{path}: member {member.name!r} is {member.size:,} bytes, over the "
                                  f"{MAX_MEMBER:,}-byte limit for one entry; hpurecipe export never writes one")
            if total > MAX_BUNDLE:
                raise BundleError(f"{path}: members add up to over {MAX_BUNDLE:,} bytes, the limit for a bundle")
            if member.name in files:
                raise BundleError(f"{path}: member {member.name!r} appears twice")
            files[member.name] = member
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as e:
        raise BundleError(f"{path}: damaged bundle ({one_line(e)})") from None
    return files


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    try:
        return tar.extractfile(member).read(MAX_MEMBER + 1)
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as e:
        raise BundleError(f"bundle member {member.name!r} cannot be read ({one_line(e)})") from None


def _json(path: Path, name: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise BundleError(f"{path}: {name} is not JSON: {e}") from None


def _info(path: Path, data: bytes) -> dict:
    info = _json(path, "bundle.json", data)
    if not isinstance(info, dict) or info.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path}: not an hpurecipe bundle")
    if info.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path}: bundle version {info.get('version')!r}; this hpurecipe reads {BUNDLE_VERSION}")
    return info


def _entry(path: Path, key: str, data: bytes) -> Entry:
    try:
        entry = decode_entry(data)
    except CorruptEntry as e:
        raise BundleError(f"{path}: entry {key} fails its check: {e}") from None
    if entry.key != key:
        raise BundleError(f"{path}: entry file {key} holds key {entry.key}")
    try:
        parse_payload(entry.payload)
    except RecipeFormatError as e:
        raise BundleError(f"{path}: entry {key} is not a recipe of this format: {e}") from None
    return entry


def check_toolchain(bundle: Bundle, force: bool) -> list[str]:
    """The toolchain fields that differ from ours; BundleError if any differ and not ``force``."""
    ours, theirs = toolchain(), bundle.info.get("toolchain") or {}
    differ = [f"{k}: bundle {theirs.get(k)!r}, here {v!r}" for k, v in ours.items() if theirs.get(k) != v]
    if differ and not force:
        raise BundleError("bundle was built by another toolchain (" + "; ".join(differ)
                          + "); its recipes would never be used here. Import anyway with --force")
    return differ
