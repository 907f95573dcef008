"""Opening the cache the commands work on, and finding entries by key prefix."""

from __future__ import annotations

from pathlib import Path

from hpu_backend.shipping.cachepolicy import config_for
from hpu_backend.formats.keyparts import toolchain_id
from recipecache import EntryInfo, RecipeCache, open_cache as open_recipe_cache
from recipecache.config import ENV_VAR
from recipecache.disk import holds_cache

from .errors import CliError
from .render import note


def open_cache(cache_dir: Path | None, *, create: bool = False, quiet: bool = False,
               remote: str | None = None, inspect: bool = False) -> RecipeCache | None:
    """The cache at ``cache_dir``; None (after a friendly note) if the directory holds none and ``create`` is
    False. With ``inspect`` (read-only commands) nothing is created or recorded and no limit is applied."""
    config = config_for(cache_dir, remote)
    if config.max_size_mb == 0:
        raise CliError(f"the recipe cache is disabled (max_size_mb 0 in {ENV_VAR})")
    if not create and not holds_cache(config.resolved_path()):
        if not quiet:
            note("No recipe cache at {} yet. Fill it with: hpurecipe warm MODEL.py", config.resolved_path())
        return None
    return open_recipe_cache(config, remote_namespace=toolchain_id(), inspect=inspect and not create)


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
