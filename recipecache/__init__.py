"""Size-bounded, multi-process-safe store of compiled recipes: bytes in, bytes out (no torch here)."""

from .cache import RecipeCache
from .config import CacheConfig, default_cache_dir
from .disabled import DisabledCache, open_cache
from .entry import FORMAT_VERSION, Entry, EntryInfo, decode_entry, encode_entry
from .errors import CacheError, CacheTimeout, ConfigError, CorruptEntry, HpuBackendError, VersionMismatch

__all__ = [
    "RecipeCache", "DisabledCache", "open_cache", "CacheConfig", "Entry", "EntryInfo", "CorruptEntry", "CacheError",
    "ConfigError", "CacheTimeout", "VersionMismatch", "HpuBackendError", "encode_entry", "decode_entry",
    "FORMAT_VERSION", "default_cache_dir",
]
