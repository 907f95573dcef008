"""Cache settings: one frozen dataclass, parsed from PT_HPU_RECIPE_CACHE_CONFIG or built in Python."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .remote import redact_url
from .safeio import read_small, write_atomic

ENV_VAR = "PT_HPU_RECIPE_CACHE_CONFIG"
POLICY_ENV = "HPU_RECIPE_CACHE_POLICY"  # eviction order: "created" (Gaudi's, the default) or "lru"
REMOTE_ENV = "HPU_RECIPE_CACHE_REMOTE"  # the fleet tier: redis://[:password@]host:port/db
REMOTE_TTL_ENV = "HPU_RECIPE_CACHE_REMOTE_TTL"  # seconds an entry lives in the fleet tier
DEFAULT_REMOTE_TTL_S = 7 * 86400
RECORD = "config.json"  # in the cache directory: the limit and policy it was last opened with
EXPECTED_FORM = "<path>,<delete_on_start true|false>,<max_size_mb>, e.g. /tmp/recipes,false,1024"
POLICIES = ("lru", "created")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_MB = 1024 * 1024


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/hpu_backend/recipes, else ~/.cache/hpu_backend/recipes."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpu_backend" / "recipes"


@dataclass(frozen=True)
class CacheConfig:
    """Where the cache lives and how big it may grow (max_size_mb: 0 disables, -1 is unbounded)."""

    path: str | os.PathLike | None = None
    delete_on_start: bool = False
    max_size_mb: float = 1024
    policy: str = ""  # "" means $HPU_RECIPE_CACHE_POLICY, else "created" (oldest created evicted first)
    memory_entries: int = 256
    per_rank: bool = False
    allow_shared_dir: bool = False
    # Additions: fsync before publishing (off only for throwaway caches) and the lock wait bound.
    fsync: bool = True
    lock_timeout_s: float = 30.0
    # The fleet tier behind the disk ("" means $HPU_RECIPE_CACHE_REMOTE, if set; "none" turns it off).
    remote: str = ""
    remote_ttl_s: float = 0.0  # 0 means $HPU_RECIPE_CACHE_REMOTE_TTL, else 7 days

    def __repr__(self) -> str:  # a configuration may be logged or shown: never with the fleet tier's password
        fields = ", ".join(f"{f.name}={redact_url(v) if f.name == 'remote' and v else v!r}"
                           for f in dataclasses.fields(self) for v in [getattr(self, f.name)])
        return f"CacheConfig({fields})"

    def __post_init__(self):
        path = default_cache_dir() if self.path in (None, "") else Path(self.path).expanduser()
        object.__setattr__(self, "path", path)
        if isinstance(self.max_size_mb, bool) or not isinstance(self.max_size_mb, (int, float)):
            raise ConfigError(f"max_size_mb must be a number, got {self.max_size_mb!r}")
        if not math.isfinite(self.max_size_mb) or (self.max_size_mb < 0 and self.max_size_mb != -1):
            raise ConfigError(f"max_size_mb must be >= 0 or -1 (unbounded), got {self.max_size_mb}")
        if not self.policy:
            object.__setattr__(self, "policy", os.environ.get(POLICY_ENV, "").strip().lower() or "created")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES} ({POLICY_ENV}), got {self.policy!r}")
        remote = self.remote or os.environ.get(REMOTE_ENV, "").strip()
        object.__setattr__(self, "remote", "" if remote == "none" else remote)
        if self.remote and not self.remote.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"remote cache {redact_url(self.remote)!r} ({REMOTE_ENV}): expected redis://host:port/db")
        if not self.remote_ttl_s:
            object.__setattr__(self, "remote_ttl_s", _env_seconds(REMOTE_TTL_ENV, DEFAULT_REMOTE_TTL_S))
        if not math.isfinite(self.remote_ttl_s) or self.remote_ttl_s <= 0:
            raise ConfigError(f"remote_ttl_s must be a finite number of seconds > 0, got {self.remote_ttl_s}")
        if self.memory_entries < 0:
            raise ConfigError(f"memory_entries must be >= 0, got {self.memory_entries}")

    @property
    def limit_bytes(self) -> int | None:
        """The disk limit in bytes; None when unbounded, 0 when disabled."""
        return None if self.max_size_mb == -1 else int(self.max_size_mb * _MB)

    @classmethod
    def parse(cls, value: str, **overrides) -> "CacheConfig":
        """Parse '<path>,<delete_on_start>,<max_size_mb>' (the path may itself contain commas)."""
        parts = value.rsplit(",", 2)
        if len(parts) != 3:
            raise ConfigError(f"{ENV_VAR}={value!r}: expected 3 comma-separated fields, {EXPECTED_FORM}")
        path, delete, size = (p.strip() for p in parts)
        if not path:
            raise ConfigError(f"{ENV_VAR}={value!r}: field 'path' is empty; expected {EXPECTED_FORM}")
        return cls(path=path, delete_on_start=_parse_bool(value, delete), max_size_mb=_parse_size(value, size),
                   **overrides)

    def config_string(self) -> str:
        """This configuration as an ENV_VAR value: the path, delete_on_start and max_size_mb, which is what
        such a string carries; ``CacheConfig.parse(c.config_string())`` gives those three fields back."""
        path = str(self.path)
        if path != path.strip():
            raise ConfigError(f"cache path {path!r} starts or ends with white space, which {ENV_VAR} cannot "
                              "carry; rename the directory")
        size = int(self.max_size_mb) if float(self.max_size_mb).is_integer() else self.max_size_mb
        return f"{path},{'true' if self.delete_on_start else 'false'},{size}"

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "CacheConfig":
        """Read PT_HPU_RECIPE_CACHE_CONFIG; unset or empty means the default directory, False, 1024 MB."""
        value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
        return cls.parse(value, **overrides) if value else cls(**overrides)

    def resolved_path(self, environ=None) -> Path:
        """The directory to use: path, or path/rank<N> when per_rank and RANK/LOCAL_RANK is set."""
        env = os.environ if environ is None else environ
        rank = env.get("RANK") or env.get("LOCAL_RANK")
        if not self.per_rank or rank is None:
            return Path(self.path)
        if not rank.isdigit():
            raise ConfigError(f"RANK/LOCAL_RANK must be a non-negative integer for per_rank, got {rank!r}")
        return Path(self.path) / f"rank{int(rank)}"


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={value!r}: expected a finite number of seconds > 0")
    return seconds


def _parse_bool(value: str, field: str) -> bool:
    if field.lower() in _TRUE:
        return True
    if field.lower() in _FALSE:
        return False
    raise ConfigError(f"{ENV_VAR}={value!r}: field 'delete_on_start' must be true or false, got {field!r}; "
                      f"expected {EXPECTED_FORM}")


def _parse_size(value: str, field: str) -> float:
    """Whole megabytes as Gaudi writes them; a fraction (e.g. 0.5) is taken too, for small test caches."""
    try:
        size = int(field)
    except ValueError:
        size = _float_or_none(field)
    if size is None or (size < 0 and size != -1):
        raise ConfigError(f"{ENV_VAR}={value!r}: field 'max_size_mb' must be a number >= 0 or -1, got "
                          f"{field!r}; expected {EXPECTED_FORM}")
    return size


def _float_or_none(field: str) -> float | None:
    try:
        size = float(field)
    except ValueError:
        return None
    return size if math.isfinite(size) else None


def record(directory: Path, config: CacheConfig) -> None:
    """Note the limit and policy in the cache directory, so that tools opening it later without a
    configuration of their own (``hpurecipe --cache-dir``) use the same ones. Best effort."""
    doc = {"max_size_mb": config.max_size_mb, "policy": config.policy}
    if recorded(directory) == doc:
        return
    try:
        write_atomic(Path(directory) / RECORD, json.dumps(doc).encode())
    except OSError:
        pass  # a read-only cache: nothing to agree on


def recorded(directory: Path) -> dict | None:
    """The limit and policy recorded in a cache directory, or None."""
    try:
        doc = json.loads(read_small(Path(directory) / RECORD))
    except (OSError, ValueError):
        return None
    ok = (isinstance(doc, dict) and isinstance(doc.get("max_size_mb"), (int, float))
          and not isinstance(doc.get("max_size_mb"), bool) and doc.get("policy") in POLICIES)
    return {"max_size_mb": doc["max_size_mb"], "policy": doc["policy"]} if ok else None
