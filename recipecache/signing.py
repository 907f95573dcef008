"""Authenticity of shipped data: HMAC-SHA256 under one team key (``HPURECIPE_BUNDLE_KEY``).

Bundles, packages and fleet entries are signed with the same key. With no key set, nothing is signed
or checked, and whoever can write a bundle, a package or the fleet namespace is trusted; with a key,
only data signed with it is accepted. The key is read from the environment, never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Iterable, Mapping

KEY_ENV = "HPURECIPE_BUNDLE_KEY"
TAG_BYTES = 32  # SHA-256


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
