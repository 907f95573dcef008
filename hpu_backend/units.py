"""How the project writes a number of bytes for people: one formatter for reports, the run summary and the CLI."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: float) -> str:
    """1536 → '1.5 KiB' (powers of 1024, as the cache limit and HBM are counted, with their IEC names)."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
