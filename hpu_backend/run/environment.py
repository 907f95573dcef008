"""The environment variables the launcher, its ranks and the device read, checked before anything runs: a bad
value is one ``RunError`` line naming the variable, its value and what is allowed (never a traceback later)."""

from __future__ import annotations

import os
from typing import Callable, Mapping

from .. import envs
from ..envs import MAX_CARDS
from .errors import RunError

# Set by a launcher for one rank of several; the ranks we start get ours, so they are checked only when the
# script runs in this process.
RANK_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
CARDS_ENV = "HPU_SIM_CARDS"  # device_count() of the simulated device
HBM_ENV = "HPU_BACKEND_HBM_BYTES"  # the device memory the simulated card holds (device/memory.py)


def check(env: Mapping[str, str] | None = None, ranks_started_here: bool = False) -> None:
    """Every variable we read, checked (``RunError`` exit 2 for the first bad one)."""
    env = os.environ if env is None else env
    if not ranks_started_here:
        _check_ranks(env)
    for name in (CARDS_ENV, HBM_ENV):
        try:
            envs.get(name, env)
        except envs.EnvError as e:
            raise RunError(str(e), 2) from None
    _check_settings(env)
    _check_mode(env)


def _check(env: Mapping[str, str], name: str, parse: Callable[[str], object], allowed: str) -> None:
    if name in env and parse(env[name]) is None:
        raise RunError(f"environment variable {name}={env[name]!r} is not valid: use {allowed}", 2)


def _whole(text: str, low: int, high: int) -> int | None:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        return None
    return int(text)


def _check_ranks(env: Mapping[str, str]) -> None:
    world = _whole(env["WORLD_SIZE"], 1, MAX_CARDS) if "WORLD_SIZE" in env else 1
    _check(env, "WORLD_SIZE", lambda v: world, f"a whole number of ranks from 1 to {MAX_CARDS}")
    local = _whole(env["LOCAL_WORLD_SIZE"], 1, world) if "LOCAL_WORLD_SIZE" in env else world
    _check(env, "LOCAL_WORLD_SIZE", lambda v: local, f"a whole number from 1 to WORLD_SIZE ({world})")
    _check(env, "RANK", lambda v: _whole(v, 0, world - 1), f"a whole number from 0 to WORLD_SIZE - 1 ({world - 1})")
    _check(env, "LOCAL_RANK", lambda v: _whole(v, 0, local - 1),
           f"a whole number from 0 to LOCAL_WORLD_SIZE - 1 ({local - 1})")


def _check_mode(env: Mapping[str, str]) -> None:
    """``PT_HPU_LAZY_MODE`` and ``HPU_SIM_RELEASE``, as the device reads them when it starts."""
    from ..device import release

    try:
        release.mode_from_env(env)
    except release.ReleaseError as e:
        raise RunError(f"environment variable {e}", 2) from None


def _check_settings(env: Mapping[str, str]) -> None:
    """The backend's variables (``HPU_BACKEND_TARGET``, ``HPU_BACKEND_BUCKETS``, ...), parsed as the backend
    will parse them at its first compile."""
    from ..settings import Settings, SettingsError

    try:
        Settings.from_options(None, env)
    except SettingsError as e:
        raise RunError(str(e), 2) from None
