"""The named exceptions of the recipe cache, and the base every error of the project sits under."""


class HpuBackendError(Exception):
    """The base of every error the project raises (the cache's, the backend's, the tools' and the command line's):
    ``except HpuBackendError`` catches ours and nothing else. It is defined here, on the lowest floor, so that the
    cache's errors sit under it too; ``hpu_backend.errors`` exports it."""


class CacheError(HpuBackendError):
    """A cache problem the caller must hear about (e.g. a cache directory other users can write)."""


class ConfigError(CacheError, ValueError):
    """A malformed cache configuration; the message names the field and shows the expected form."""


class CorruptEntry(CacheError):
    """Raised by decode_entry for bytes that are not a valid entry; the cache turns it into a miss."""


class VersionMismatch(CorruptEntry):
    """An entry written by another FORMAT_VERSION: a miss to replace, not damage to quarantine."""


class CacheTimeout(CacheError):
    """The cache lock was not acquired in time; the background writer drops the write with a warning."""
