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


# Units a size may be written in: decimal (kB = 1000) and binary (KiB = 1024), as a user types them (``1GB``).
_PARSE = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
SIZE_FORMS = "a whole number of bytes, or a number with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, " \
             "GiB, TiB (powers of 1024), e.g. 1GB"
MAX_SIZE = 1 << 60  # an exbibyte: past any device; a larger value is a typo


def parse_size(text: str) -> int | None:
    """'1GB' → 10**9, '16GiB' → 2**34, '1e6' → 10**6; None for anything else (negative, zero, NaN, no unit we
    know, past ``MAX_SIZE``): the caller names the variable in its error."""
    raw = str(text).strip().lower().replace("_", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = raw[len(number):].strip() if raw.startswith(number) else None
    if unit not in _PARSE or not number:
        return None
    try:
        value = float(number) * _PARSE[unit]
    except ValueError:
        return None
    if not 1 <= value <= MAX_SIZE:  # NaN fails both comparisons
        return None
    return int(value)
