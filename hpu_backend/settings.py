"""Backend settings: one frozen dataclass, filled from defaults, the environment and ``options=``.

Precedence: ``torch.compile(..., options={...})`` over environment variables over defaults.
Every field marked ``key=True`` changes the recipe and is part of the recipe key; ``key="when_set"`` is part
of it when it differs from its default (so that the keys of recipes made without it stay as they were).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from recipecache import CacheConfig, ConfigError
from recipecache.config import ENV_VAR

from . import envs
from .buckets import BucketError, Policy, parse_policy, policies_for
from .errors import HpuBackendError

TARGETS = ("gaudi2", "gaudi3")  # the devices of targets.py (a test keeps them equal)
DTYPE_POLICIES = ("native", "fp8")  # lowering/passes/apply_dtype_policy.py


class SettingsError(HpuBackendError, ValueError):
    """An unknown option or a value of the wrong form (raised by ``Settings.from_options``)."""


MAX_WHOLE = 2 ** 31 - 1  # whole-number settings count nodes or recompiles: past this, a typo (10e30)


def _key(default: Any, env: str, doc: str, key: bool | str = True, choices: tuple[str, ...] = ()):
    return field(default=default, metadata={"env": env, "doc": doc, "key": key, "choices": choices})


@dataclass(frozen=True)
class Settings:
    strict: bool = _key(
        False, "HPU_BACKEND_STRICT",
        "raise on a lowering failure or CPU fallback instead of running that graph eagerly (a library custom op's "
        "CPU fallback is allowed: it has no device kernel anywhere; also PT_HPU_USE_EAGER_FALLBACK=0)", key=False)
    target: str = _key("gaudi2", "HPU_BACKEND_TARGET", "device for the plan and estimate: gaudi2 | gaudi3",
                       choices=TARGETS)
    buckets: Any = _key(
        "exp", "HPU_BACKEND_BUCKETS",
        "shape bucketing: exact | exp[:MIN[:MAX]] | lin:STEP[:MAX] | list:B1,B2,...; "
        "or a map from symbol (s0, s1, ...) to one of those, '*' for the rest")
    fusion: bool = _key(True, "HPU_BACKEND_FUSION", "fuse TPC chains and attention (FusedSDPA)")
    place_on_cpu: frozenset = _key(
        frozenset(), "PT_HPU_PLACE_ON_CPU", "aten op names to run on the CPU (comma list)")
    dtype_policy: str = _key(
        "native", "HPU_BACKEND_DTYPE_POLICY",
        "storage dtypes of the plan and estimate: native (as traced) | fp8 (matmul operands, weights and KV "
        "cache in fp8; plans only, with execute=false)", choices=DTYPE_POLICIES)
    max_compound_op_size: int = _key(
        0, "PT_HPU_MAX_COMPOUND_OP_SIZE",
        "most nodes in one device cluster; a larger cluster is cut in schedule order (0: no limit)", key="when_set")
    cache: bool = _key(True, "HPU_BACKEND_CACHE", "use the recipe disk cache", key=False)
    cache_config: Any = _key(  # a CacheConfig, parsed once here from its string form; None: the defaults
        None, ENV_VAR, "disk cache: <path>,<delete_on_start>,<max_size_mb> (or a recipecache.CacheConfig); unset: "
        "~/.cache/hpu_backend/recipes,false,1024", key=False)
    recompile_warn: int = _key(
        4, "HPU_BACKEND_RECOMPILE_WARN",
        "recompiles of one function after which one warning names their causes", key=False)
    model: str = _key("", "HPU_BACKEND_MODEL", "label stored with cache entries", key=False)
    execute: bool = _key(
        True, "HPU_BACKEND_EXECUTE",
        "run recipes; false compiles and caches them but returns uninitialized outputs (prebuild)", key=False)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        values = {f.name: _parse(f, env[f.metadata["env"]], "environment variable " + f.metadata["env"])
                  for f in dataclasses.fields(cls) if f.metadata["env"] in env}
        try:
            if not envs.get("PT_HPU_USE_EAGER_FALLBACK", env):
                values["strict"] = True
        except envs.EnvError as e:
            raise SettingsError(str(e)) from None
        options = dict(options or {})
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise SettingsError(
                f"unknown hpu_backend option(s) {unknown}; valid options: {', '.join(cls.names())}")
        for f in dataclasses.fields(cls):
            if f.name in options:
                values[f.name] = _parse(f, options[f.name], f"option {f.name!r}")
        settings = cls(**values)
        settings._check()
        return settings

    def _check(self) -> None:
        if self.dtype_policy != "native" and self.execute:
            raise SettingsError(f"option dtype_policy={self.dtype_policy!r} plans storage the simulated device "
                                "cannot execute: use it with execute=false (prebuild, capacity planning)")

    def bucket_policies(self, symbols: list[str]) -> list[Policy]:
        """One shape-bucket policy per symbol, from ``buckets`` (validated when these settings were made)."""
        return policies_for(self.buckets, symbols)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def key_fields(self) -> dict[str, Any]:
        """The settings that change a recipe, in a canonical plain form for the recipe key."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.metadata["key"] == "when_set" and v == f.default:
                continue
            if f.metadata["key"]:
                out[f.name] = sorted(v) if isinstance(v, frozenset) else v
        return out


def _parse(f: dataclasses.Field, value: Any, where: str) -> Any:
    kind = type(f.default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"{where} must be a boolean (true/false/1/0), got {value!r}")
    if kind is frozenset:
        items = value.split(",") if isinstance(value, str) else value
        try:
            return frozenset(str(x).strip() for x in items if str(x).strip())
        except TypeError:
            raise SettingsError(f"{where} must be a comma list or a list of op names, got {value!r}") from None
    if kind is int:
        try:
            number = int(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not 0 <= number <= MAX_WHOLE:
            raise SettingsError(f"{where} must be a whole number from 0 to {MAX_WHOLE}, got {value!r}")
        return number
    if f.name == "buckets":
        return _buckets(value, where)
    if f.name == "cache_config":
        return _cache_config(value, where)
    if not isinstance(value, str):
        raise SettingsError(f"{where} must be a string, got {value!r}")
    choices = f.metadata["choices"]
    if choices and value not in choices:
        raise SettingsError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _buckets(value: Any, where: str) -> str | tuple[tuple[str, str], ...]:
    """The ``buckets`` setting in its keyed form (a string, or sorted (symbol, policy) pairs), every policy parsed
    now: a typo is an error at the call, not a graph that runs eagerly later."""
    parsed = tuple(sorted((str(k), str(v)) for k, v in value.items())) if isinstance(value, Mapping) else str(value)
    for policy in [p for _, p in parsed] if isinstance(parsed, tuple) else [parsed]:
        try:
            parse_policy(policy)
        except BucketError as e:
            raise SettingsError(f"{where}: {e}") from None
    return parsed


def _cache_config(value: Any, where: str) -> CacheConfig | None:
    if isinstance(value, CacheConfig) or value is None:
        return value
    if not isinstance(value, str):
        raise SettingsError(f"{where} must be a string <path>,<delete_on_start>,<max_size_mb> or a CacheConfig, "
                            f"got {value!r}")
    try:
        return CacheConfig.parse(value) if value.strip() else None
    except ConfigError as e:
        raise SettingsError(str(e)) from None
