"""The project's base exception, and error text for people: one line per exception (torch-free, imported by
every layer that reports)."""

from __future__ import annotations

import re

from recipecache.errors import HpuBackendError

__all__ = ["HpuBackendError", "one_line"]


# Dynamo's wrapper of an op that failed on fake tensors names the real error inside its explanation:
# "... when making fake tensor call\n  Explanation: ...: got RuntimeError('a and b must have same ...')".
_FAKE_CALL = re.compile(r"when making fake tensor call.*?: got (?P<type>\w+)\((?P<q>['\"])(?P<msg>.+?)(?P=q)\)", re.S)


def one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` of an exception (or of the one a backend or tracer failure wraps)."""
    inner = getattr(e, "inner_exception", None) or e  # Dynamo's BackendCompilerFailed wraps the real one
    if m := _FAKE_CALL.search(str(inner)):
        text = f"{m['type']}: {m['msg'].strip()}"
    else:
        lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
        text = f"{type(inner).__name__}: {lines[0]}" if lines else type(inner).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"

