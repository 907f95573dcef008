"""Bundles: one tar file of cache entries (their own checksummed format), manifests and the toolchain.

Layout: ``bundle.json`` (format, toolchain, entry list), ``entries/<key>.rcp`` (each entry exactly
as the cache encodes it: header, payload, checksum), ``manifests/<name>.json``, optionally
``precompiled/<file>`` (a precompiled directory: its manifest and artifacts, each signed on its own and
checked when loaded, never unpickled here) and, when signed, ``bundle.sig``. Reading opens only a regular file (never a
FIFO or a device, never blocking), streams
the tar one member at a time, never extracts to disk, accepts only those names and regular files
within size limits checked from their headers, reads an entry's fixed prefix before the rest (a
member whose size its prefix does not account for is refused unread), and checks every entry's
checksum and that its payload is a recipe before anything is imported. No pickle anywhere.

Signing (optional): with a key (``HPURECIPE_BUNDLE_KEY``), ``bundle.sig`` holds an HMAC-SHA256 over
every other member's name and SHA-256; a reader given a key accepts only a bundle whose signature
matches it.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import io
import json
import os
import re
import stat
import tarfile
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipecache import CorruptEntry, Entry, RecipeCache, decode_entry, encode_entry
from recipecache.entry import PREFIX_SIZE, DIGEST_SIZE, decode_prefix
from recipecache.safeio import open_regular
from recipecache.signing import KEY_ENV, signing_key

from ..formats.keyparts import toolchain, usable
from ..errors import one_line
from ..formats.program import Program, parse_payload
from ..formats.writes import declaration_problem
from ..formats.recipe import RecipeFormatError
from ..errors import HpuBackendError

BUNDLE_FORMAT = "hpurecipe-bundle"
BUNDLE_VERSION = 1
_ENTRY = re.compile(r"entries/([0-9A-Za-z_-]{1,128})\.rcp")
_MANIFEST = re.compile(r"manifests/([0-9A-Za-z_.-]{1,200}\.json)")
_PRECOMPILED = re.compile(r"precompiled/(manifest\.json|[0-9A-Za-z_-]{1,200}\.hpuaot)")  # hpurecipe precompile's
MAX_ARTIFACT = 1024**3  # one precompiled artifact (its recipes and torch's part)
MAX_MEMBER = 64 * 1024**2  # one entry (a recipe is KBs to a few MB)
MAX_JSON = 16 * 1024**2  # bundle.json, a manifest, the signature
MAX_BUNDLE = 4 * 1024**3  # all members together
MAX_MEMBERS = 100_000
SIGNATURE = "bundle.sig"


def bundle_key(environ=None) -> bytes | None:
    """The signing key from the environment, or None (``recipecache.signing``: one key for all shipped data)."""
    return signing_key(environ)


class BundleError(HpuBackendError, ValueError):
    """A bundle that is not ours, is damaged, unsigned or signed with another key, or from another toolchain."""


@dataclass
class Bundle:
    info: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    manifests: dict[str, dict] = field(default_factory=dict)
    signed: bool = False  # its signature was checked against a key
    precompiled: dict[str, bytes] = field(default_factory=dict)  # a precompiled directory's files, by name


def write_bundle(path: Path, cache: RecipeCache, keys: list[str], manifests: dict[str, dict],
                 key: bytes | None = None, precompiled: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Write the entries under ``keys`` (read without counting hits), ``manifests`` and a precompiled directory's
    files (name -> bytes) to a tar file, signed with ``key`` if given."""
    entries = [e for e in (cache.peek(k) for k in keys) if e is not None]
    precompiled = precompiled or {}
    info = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "toolchain": toolchain(), "created": time.time(),
            "entries": [{"key": e.key, "model": e.meta.get("model", ""), "graph": e.meta.get("graph", "")}
                        for e in entries], "manifests": sorted(manifests), "precompiled": sorted(precompiled)}
    if not path.parent.is_dir():
        raise BundleError(f"cannot write {path}: there is no directory {path.parent}")
    _check_destination(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        members = {"bundle.json": json.dumps(info, indent=1, sort_keys=True).encode()}
        members.update({f"entries/{e.key}.rcp": encode_entry(e.key, e.payload, e.meta, e.created) for e in entries})
        members.update({f"manifests/{name}": json.dumps(doc, indent=1, sort_keys=True).encode()
                        for name, doc in sorted(manifests.items())})
        members.update({f"precompiled/{name}": data for name, data in sorted(precompiled.items())})
        if key is not None:
            members[SIGNATURE] = _signature(key, {n: hashlib.sha256(d).digest() for n, d in members.items()})
        tmp.unlink(missing_ok=True)  # a fresh file: never written through a link left at its name
        with os.fdopen(open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as f, \
                tarfile.open(fileobj=f, mode="w") as tar:
            for name, data in members.items():
                _add(tar, name, data)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write {path}: {e.strerror or e}") from None
    return info


def _check_destination(path: Path) -> None:
    """BundleError if ``path`` exists and is not a regular file (a device, a FIFO, a directory, a link):
    export never replaces one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"cannot write {path}: it exists and is not a regular file; give a new file name")


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
    With ``key``, the bundle must be signed with it. Each member is checked by its header, then read
    (capped) and checked, before the next is looked at."""
    bundle, digests, raw = Bundle({}, signed=key is not None), {}, {}
    with _open_tar(path) as tar:
        for member in _members(path, tar):
            content = _read(path, tar, member)
            digests[member.name] = hashlib.sha256(content).digest()
            if (m := _ENTRY.fullmatch(member.name)) is not None:
                bundle.entries.append(_entry(path, m.group(1), content))
            elif (m := _MANIFEST.fullmatch(member.name)) is not None:
                bundle.manifests[m.group(1)] = _json(path, member.name, content)
            elif (m := _PRECOMPILED.fullmatch(member.name)) is not None:
                bundle.precompiled[m.group(1)] = content  # checked (signature first) when loaded
            else:
                raw[member.name] = content  # bundle.json or the signature
    if "bundle.json" not in raw:
        raise BundleError(f"{path}: not an hpurecipe bundle (no bundle.json)")
    _check_signature(path, digests, raw.get(SIGNATURE), key)
    bundle.info = _info(path, raw["bundle.json"])
    return bundle


@contextmanager
def _open_tar(path: Path):
    """The tar (plain or compressed) in the regular file ``path``, opened without blocking: a FIFO, a device
    or a directory is refused at once."""
    try:
        f = os.fdopen(open_regular(path), "rb")
    except OSError as e:
        reason = "not a regular file" if e.errno in (errno.EINVAL, errno.ELOOP) else e.strerror or e
        raise BundleError(f"cannot read {path}: {reason}") from None
    with f:
        try:
            tar = tarfile.open(fileobj=f, mode="r:*")
        except (tarfile.TarError, EOFError, OSError, zlib.error):
            raise BundleError(f"{path}: not a bundle (not a tar file, plain or compressed)") from None
        with tar:
            yield tar


def _check_signature(path: Path, digests: dict[str, bytes], signature: bytes | None, key: bytes | None) -> None:
    if key is None:
        return
    if signature is None:
        raise BundleError(f"{path}: the bundle is not signed, and {KEY_ENV} is set: only signed bundles are "
                          "imported (export it again with the key set)")
    expected = _signature(key, {n: d for n, d in digests.items() if n != SIGNATURE})
    if not hmac.compare_digest(expected, signature.strip()):
        raise BundleError(f"{path}: the signature does not match: the bundle was changed after signing, or "
                          f"signed with another key than {KEY_ENV}")


def _members(path: Path, tar: tarfile.TarFile):
    """The members, one at a time, each checked by its header (a regular file of an expected name, within
    the size limits, not seen before) before it is read, so that a forged size or name is refused before
    anything is read or inflated."""
    seen, total = set(), 0
    try:
        for member in tar:
            total += member.size
            name = member.name
            if not member.isfile():
                raise BundleError(f"{path}: member {name!r:.80} is not a regular file")
            if not (_ENTRY.fullmatch(name) or _MANIFEST.fullmatch(name) or _PRECOMPILED.fullmatch(name)
                    or name in ("bundle.json", SIGNATURE)):
                raise BundleError(f"{path}: unexpected member {name!r:.80}")
            limit = MAX_MEMBER if _ENTRY.fullmatch(name) else MAX_ARTIFACT if name.endswith(".hpuaot") else MAX_JSON
            if member.size > limit:
                raise BundleError(f"{path}: member {name!r} is {member.size:,} bytes, over the {limit:,}-byte "
                                  "limit for one; hpurecipe export never writes one")
            if total > MAX_BUNDLE or len(seen) >= MAX_MEMBERS:
                raise BundleError(f"{path}: over {MAX_BUNDLE:,} bytes or {MAX_MEMBERS:,} members, the limits "
                                  "for a bundle")
            if name in seen:
                raise BundleError(f"{path}: member {name!r} appears twice")
            seen.add(name)
            yield member
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as e:
        raise BundleError(f"{path}: damaged bundle ({one_line(e)})") from None


def _read(path: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The member's bytes; an entry's prefix is read and checked first, so a member whose size the prefix
    does not account for (e.g. megabytes of zeros) is refused after a few bytes."""
    try:
        f = tar.extractfile(member)
        if not _ENTRY.fullmatch(member.name):
            return f.read(member.size)
        head = f.read(PREFIX_SIZE)
        try:
            header_len, payload_len = decode_prefix(head)
        except CorruptEntry as e:
            raise BundleError(f"{path}: {member.name} is not a cache entry: {e}") from None
        if PREFIX_SIZE + header_len + payload_len + DIGEST_SIZE != member.size:
            raise BundleError(f"{path}: {member.name} is {member.size:,} bytes, not the size its prefix gives")
        return head + f.read(member.size - len(head))
    except BundleError:
        raise
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
        parsed = parse_payload(entry.payload)
    except RecipeFormatError as e:
        raise BundleError(f"{path}: entry {key} is not a recipe of this format: {e}") from None
    recipes = [g.template for g in parsed.graphs] if isinstance(parsed, Program) else [parsed]
    problem = next((p for r in recipes if (p := declaration_problem(r))), None)
    if problem:  # an entry whose ops write inputs it does not declare is never taken in
        raise BundleError(f"{path}: entry {key}: {problem}")
    return entry


def check_toolchain(bundle: Bundle, force: bool) -> list[str]:
    """The toolchain fields that differ from ours; BundleError if any differ and not ``force``, saying how many of
    its entries could hit here ("0 of 412 entries usable here: built with torch 2.11.0 (here 2.13.0)")."""
    ours, theirs = toolchain(), bundle.info.get("toolchain") or {}
    differ = [f"{k}: bundle {theirs.get(k)!r}, here {v!r}" for k, v in ours.items() if theirs.get(k) != v]
    if differ and not force:
        raise BundleError("bundle was built by another toolchain (" + "; ".join(differ) + "): "
                          + usable_entries(bundle) + "; its recipes would never be used here. "
                          "Import anyway with --force")
    return differ


def usable_entries(bundle: Bundle) -> str:
    """How many of the bundle's entries this toolchain can hit, and why not the others, from the toolchain each
    entry recorded: "3 of 412 entries usable here: built with torch 2.11.0 (here 2.13.0)"."""
    count, why = usable([e.meta for e in bundle.entries])
    text = f"{count} of {len(bundle.entries)} entries usable here"
    return text + (": built with " + ", ".join(why) if why else "")


def unusable(bundle: Bundle) -> str | None:
    """The warning for a bundle some of whose entries cannot hit here (None: all can), before any is copied."""
    count, _ = usable([e.meta for e in bundle.entries])
    return None if count == len(bundle.entries) else usable_entries(bundle)
