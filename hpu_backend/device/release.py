"""The Intel Gaudi software release the device simulates, and the execution mode it defaults to.

Gaudi's PyTorch bridge reads ``PT_HPU_LAZY_MODE`` when it loads: 1 is lazy mode, 0 is eager mode with
torch.compile. Up to software 1.20 an unset variable meant lazy mode; from 1.21 on it means eager mode, and
lazy mode is the legacy fallback. ``HPU_SIM_RELEASE`` names the release simulated (the newest known by default),
and an unset ``PT_HPU_LAZY_MODE`` follows that release's default.
"""

from __future__ import annotations

import os
from typing import Mapping
from ..errors import HpuBackendError

RELEASE_ENV = "HPU_SIM_RELEASE"
LAZY_ENV = "PT_HPU_LAZY_MODE"
# release -> the mode an unset PT_HPU_LAZY_MODE selects (Intel's runtime flag tables of each release)
DEFAULT_MODES = {"1.18.0": "lazy", "1.19.0": "lazy", "1.20.0": "lazy", "1.21.0": "eager", "1.22.0": "eager"}
NEWEST = "1.22.0"


class ReleaseError(HpuBackendError, ValueError):
    """An unknown release or an invalid ``PT_HPU_LAZY_MODE``: one line naming the variable and what is allowed."""


def release(env: Mapping[str, str] | None = None) -> str:
    """The simulated release: ``HPU_SIM_RELEASE`` (``1.21`` or ``1.21.0``), else the newest known."""
    text = (os.environ if env is None else env).get(RELEASE_ENV, "").strip()
    if not text:
        return NEWEST
    name = text if text.count(".") == 2 else f"{text}.0"
    if name not in DEFAULT_MODES:
        raise ReleaseError(f"{RELEASE_ENV}={text!r}: not a Gaudi software release the device simulates; "
                           f"use one of {', '.join(DEFAULT_MODES)}")
    return name


def mode_from_env(env: Mapping[str, str] | None = None) -> str:
    """``lazy`` or ``eager``: ``PT_HPU_LAZY_MODE`` when set, else the simulated release's default."""
    value = (os.environ if env is None else env).get(LAZY_ENV, "").strip()
    if value == "":
        return DEFAULT_MODES[release(env)]
    if value not in ("0", "1"):
        raise ReleaseError(f"{LAZY_ENV}={value!r}: use 1 (lazy mode) or 0 (eager mode with torch.compile; "
                           f"the default from Gaudi software 1.21 on)")
    return "lazy" if value == "1" else "eager"
