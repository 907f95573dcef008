"""Parsing human amounts on the command line: ages (7d, 12h, 30m) and sizes (500MB, 2GB)."""

from __future__ import annotations

import re

from .errors import UsageError
from .options import BOUNDS

_AGE = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
         "g": 1024**3, "gb": 1024**3, "gib": 1024**3, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}


def parse_age(text: str) -> float:
    """'7d' → seconds (units s, m/min, h, d, w)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", text.lower())
    if not m or m.group(2) not in _AGE:
        raise UsageError(f"--older-than {text!r}: expected a number and a unit (s, m, h, d, w), e.g. 7d")
    seconds = float(m.group(1)) * _AGE[m.group(2)]
    if not seconds <= BOUNDS["--older-than"][1]:  # an age of 10^400 days is infinite
        raise UsageError(f"--older-than {text!r}: expected an age of at most {BOUNDS['--older-than'][1] // 86400:,} "
                         "days")
    return seconds


def parse_size(text: str) -> int:
    """'500MB' → bytes (powers of 1024, as the cache limit is counted)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _SIZE:
        raise UsageError(f"--max-size {text!r}: expected a size such as 500MB or 2GB")
    size = float(m.group(1)) * _SIZE[m.group(2)]
    if not size <= BOUNDS["--max-size"][1]:  # an infinite size has no integer form
        raise UsageError(f"--max-size {text!r}: expected a size of at most {BOUNDS['--max-size'][1] >> 50:,} PiB")
    return int(size)
