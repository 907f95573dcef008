"""Opening the cache the commands work on, and finding entries by key prefix."""

from __future__ import annotations

from pathlib import Path

from hpu_backend.aot.cachepolicy import config_for
from hpu_backend.formats.keyparts import toolchain_id
from recipecache import EntryInfo, RecipeCache
from recipecache.config import ENV_VAR

from .errors import CliError
from .render import note


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
