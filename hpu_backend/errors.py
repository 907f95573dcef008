"""Error text for people: one line per exception (torch-free, imported by every layer that reports)."""

from __future__ import annotations


def one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` of an exception (or of the one a backend failure wraps)."""
    inner = getattr(e, "inner_exception", None) or e  # Dynamo's BackendCompilerFailed wraps the real one
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    text = f"{type(inner).__name__}: {lines[0]}" if lines else type(inner).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"

