"""Size-bounded, multi-process-safe store of compiled recipes: bytes in, bytes out (no torch here).

Each name below loads its module on first use: a process that only needs an error class or the signing key
(a package start) does not import the cache, its locks and its eviction.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RecipeCache": "cache", "CacheConfig": "config", "default_cache_dir": "config",
    "DisabledCache": "disabled", "open_cache": "disabled",
    "FORMAT_VERSION": "entry", "Entry": "entry", "EntryInfo": "entry", "decode_entry": "entry",
    "encode_entry": "entry",
    "CacheError": "errors", "CacheTimeout": "errors", "ConfigError": "errors", "CorruptEntry": "errors",
    "HpuBackendError": "errors", "VersionMismatch": "errors",
}

__all__ = [
    "RecipeCache", "DisabledCache", "open_cache", "CacheConfig", "Entry", "EntryInfo", "CorruptEntry", "CacheError",
    "ConfigError", "CacheTimeout", "VersionMismatch", "HpuBackendError", "encode_entry", "decode_entry",
    "FORMAT_VERSION", "default_cache_dir",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'recipecache' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
