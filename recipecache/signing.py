"""Authenticity of stored data: HMAC-SHA256 under a team key (``HPURECIPE_BUNDLE_KEY``) or this user's own key.

Bundles, packages and fleet entries are signed with the team key. With no key set, nothing of theirs is
signed or checked, and whoever can write a bundle, a package or the fleet namespace is trusted; with a key,
only data signed with it is accepted. The team key is read from the environment, never stored.

Precompiled artifacts hold a pickle (loading one runs code), so they are always signed: with the team key
when it is set (to load them on other machines), else with this user's own key, ``machine.key`` in
``$XDG_CONFIG_HOME/hpu_backend`` (``~/.config/hpu_backend``): 32 random bytes made by the first precompile,
written 0600, and refused unless it is a regular file of this user that no one else may read, in a directory of
this user that no one else may write.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from . import safeio
from .errors import HpuBackendError

KEY_ENV = "HPURECIPE_BUNDLE_KEY"
CONFIG_ENV = "XDG_CONFIG_HOME"
KEY_FILE = "machine.key"
TAG_BYTES = 32  # SHA-256
MACHINE_KEY_BYTES = 32
TEAM, MACHINE = "team", "machine"


class SigningKeyError(HpuBackendError, ValueError):
    """This user's key file cannot be used (the message says what to do)."""


@dataclass(frozen=True)
class Signer:
    """A key and where it comes from: ``kind`` TEAM (``HPURECIPE_BUNDLE_KEY``) or MACHINE (this user's key file)."""

    key: bytes
    kind: str

    @property
    def id(self) -> str:
        return key_id(self.key)

    def record(self) -> dict[str, str]:
        """What a signed file notes about its signer (never the key): its kind and id."""
        return {"kind": self.kind, "id": self.id}


def signing_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The team key from the environment, or None (nothing signed, nothing checked)."""
    value = (os.environ if environ is None else environ).get(KEY_ENV, "")
    return value.encode() if value else None


def sign(key: bytes, parts: Iterable[bytes]) -> bytes:
    """The HMAC-SHA256 tag of ``parts``, each length-prefixed so that no two splits of the same bytes agree."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.digest()


def verify(key: bytes, parts: Iterable[bytes], tag: bytes) -> bool:
    """Whether ``tag`` is ``sign(key, parts)`` (compared in constant time)."""
    return hmac.compare_digest(sign(key, parts), tag)


def key_id(key: bytes) -> str:
    """A short name of a key that does not reveal it: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]


def key_path(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/hpu_backend/machine.key, else ~/.config/hpu_backend/machine.key."""
    base = (os.environ if environ is None else environ).get(CONFIG_ENV, "").strip()
    return Path(base or os.path.join(os.path.expanduser("~"), ".config")) / "hpu_backend" / KEY_FILE


def own_signer(create: bool = False, environ: Mapping[str, str] | None = None) -> Signer | None:
    """The key precompiled artifacts are signed and checked with: the team key if set, else this user's own key
    (made now if ``create`` and there is none yet; None if there is none and not ``create``)."""
    team = signing_key(environ)
    if team is not None:
        return Signer(team, TEAM)
    key = machine_key(create, environ)
    return None if key is None else Signer(key, MACHINE)


def machine_key(create: bool = False, environ: Mapping[str, str] | None = None) -> bytes | None:
    """This user's own key; SigningKeyError (one line) if its file is not one to trust."""
    path = key_path(environ)
    key = _read_key(path)
    if key is None and create:
        _write_key(path, secrets.token_bytes(MACHINE_KEY_BYTES))
        key = _read_key(path)
    return key


def _read_key(path: Path) -> bytes | None:
    fix = "remove it to make a new one at the next precompile (what it signed must be precompiled again)"
    try:
        fd = safeio.open_regular(path)  # never through a link, never a FIFO
    except FileNotFoundError:
        return None
    except OSError as e:
        what = "a link" if e.errno == errno.ELOOP else "not a regular file" if e.errno == errno.EINVAL else None
        if what is None:
            raise SigningKeyError(f"{path}: cannot read this machine's signing key: {e.strerror or e}") from None
        raise SigningKeyError(f"{path}: this machine's signing key is {what}; {fix}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise SigningKeyError(f"{path}: this machine's signing key belongs to another user; {fix}")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise SigningKeyError(f"{path}: this machine's signing key is readable or writable by others; "
                                  f"chmod 600 it if no one else read it, else {fix}")
        key = safeio.read_at_most(fd, MACHINE_KEY_BYTES + 1)
    finally:
        os.close(fd)
    _check_directory(path.parent)
    if len(key) != MACHINE_KEY_BYTES:
        raise SigningKeyError(f"{path}: not a signing key ({len(key)} bytes, not {MACHINE_KEY_BYTES}); {fix}")
    return key


def _check_directory(directory: Path) -> None:
    """SigningKeyError unless the key's directory is this user's and no one else may write it: whoever can write
    it can put a key of their own in its place, and sign what this user then loads."""
    st = os.stat(directory)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o022:
        whose = "belongs to another user" if st.st_uid != os.getuid() else "is writable by others"
        raise SigningKeyError(f"{directory}: the directory of this machine's signing key {whose}, so anyone could "
                              f"replace the key; chmod 700 it (and check the key in it is yours)")


def _write_key(path: Path, key: bytes) -> None:
    """Write a new key file, private from its first byte, under its name at once; a key another process wrote
    meanwhile is kept (whatever it signed stays valid)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = safeio.open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode=0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a key already there
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
