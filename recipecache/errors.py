"""The named exceptions of the recipe cache."""


class CacheError(Exception):
    """A cache problem the caller must hear about (e.g. a cache directory other users can write)."""


class ConfigError(CacheError, ValueError):
    """A malformed cache configuration; the message names the field and shows the expected form."""


class CorruptEntry(CacheError):
    """Raised by decode_entry for bytes that are not a valid entry; the cache turns it into a miss."""


class VersionMismatch(CorruptEntry):
    """An entry written by another FORMAT_VERSION: a miss to replace, not damage to quarantine."""


class CacheTimeout(CacheError):
    """The cache lock was not acquired in time; the background writer drops the write with a warning."""
