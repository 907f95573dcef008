"""Opening the cache the commands work on, and finding entries by key prefix."""

from __future__ import annotations

import os
from pathlib import Path

from hpu_backend.formats.keyparts import toolchain_id
from recipecache import CacheConfig, EntryInfo, RecipeCache
from recipecache.config import ENV_VAR, recorded

from .errors import CliError
from .render import note


def config_for(cache_dir: Path | None, remote: str | None = None) -> CacheConfig:
    """The backend's cache configuration (its environment variable, ENV_VAR), at ``cache_dir`` if given.

    The size limit and eviction policy are the variable's when it names this directory,
    else those recorded in the directory by the processes that filled it (else the defaults). The
    command line never deletes on start: that is for serving processes that ask for it.
    """
    base = CacheConfig.from_env()
    path = Path(cache_dir or base.path).expanduser()
    if os.environ.get(ENV_VAR, "").strip() and path == Path(base.path):
        return CacheConfig(path=path, max_size_mb=base.max_size_mb, policy=base.policy, remote=remote or "")
    return CacheConfig(path=path, remote=remote or "", **(recorded(path) or {}))


def open_cache(cache_dir: Path | None, *, create: bool = False, quiet: bool = False,
               remote: str | None = None) -> RecipeCache | None:
    """The cache at ``cache_dir``; None (after a friendly note) if it does not exist and ``create`` is False."""
    config = config_for(cache_dir, remote)
    if config.max_size_mb == 0:
        raise CliError(f"the recipe cache is disabled (max_size_mb 0 in {ENV_VAR})")
    if not create and not Path(config.resolved_path()).is_dir():
        if not quiet:
            note("No recipe cache at {} yet. Fill it with: hpurecipe warm MODEL.py", config.resolved_path())
        return None
    return RecipeCache(config, remote_namespace=toolchain_id())


def resolve_key(cache: RecipeCache | None, prefix: str, infos: list[EntryInfo] | None = None) -> str:
    """The one key starting with ``prefix`` (CliError if none or several)."""
    infos = (cache.entries() if cache is not None else []) if infos is None else infos
    matches = [i.key for i in infos if i.key.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CliError(f"no entry with key {prefix!r} in the recipe cache")
    shown = ", ".join(m[:16] for m in matches[:5]) + (" ..." if len(matches) > 5 else "")
    raise CliError(f"key prefix {prefix!r} is ambiguous: {len(matches)} entries match ({shown})")
