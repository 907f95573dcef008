"""vLLM-Gaudi's bucket file (``VLLM_BUCKETING_FROM_FILE``), read as data (torch-free).

One bucket per line as ``(batch, query, context blocks)``; any element may be a list or ``range(start, stop[,
step])`` and the line stands for their product; a query of 1 makes a decode bucket ``(batch, 1, blocks)``, any
other a prompt bucket. Blank lines and ``#`` comments are skipped, and so (as vLLM-Gaudi does, with a warning) is a
line that is not such a triple. Nothing is evaluated: a line is parsed by ``ast.literal_eval`` after the ranges
are written out as lists.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from ...errors import HpuBackendError

MAX_FILE_BYTES = 1 << 20
MAX_RANGE = 10_000  # vLLM-Gaudi leaves a longer range unexpanded, which makes its line invalid
MAX_BUCKETS = 20_000
_RANGE = re.compile(r"range\(\s*(-?\d+)\s*,\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?\)")


class BucketFileError(HpuBackendError, ValueError):
    """A bucket file that cannot be read or holds too many buckets (one line naming the file)."""


@dataclass(frozen=True)
class BucketFile:
    prompt: tuple[tuple[int, int, int], ...]
    decode: tuple[tuple[int, int, int], ...]
    skipped: tuple[int, ...]  # line numbers vLLM-Gaudi would skip with a warning


def read(path: str | Path) -> BucketFile:
    path = Path(path)
    try:
        if not path.is_file():
            raise BucketFileError(f"VLLM_BUCKETING_FROM_FILE={path}: not a file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise BucketFileError(f"VLLM_BUCKETING_FROM_FILE={path}: larger than {MAX_FILE_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BucketFileError(f"VLLM_BUCKETING_FROM_FILE={path}: {e.__class__.__name__}: {e}") from None
    return parse(text, str(path))


def parse(text: str, name: str = "<bucket file>") -> BucketFile:
    prompt, decode, skipped = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        triple = _triple(line)
        if triple is None:
            skipped.append(number)
            continue
        for bucket in itertools.product(*triple):
            (decode if bucket[1] == 1 else prompt).append(bucket)
        if len(prompt) + len(decode) > MAX_BUCKETS:
            raise BucketFileError(f"VLLM_BUCKETING_FROM_FILE={name}: more than {MAX_BUCKETS:,} buckets by line "
                                  f"{number}")
    return BucketFile(tuple(sorted(prompt)), tuple(sorted(decode)), tuple(skipped))


def _triple(line: str) -> tuple[list[int], list[int], list[int]] | None:
    try:
        value = ast.literal_eval(_RANGE.sub(_expand, line))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, tuple) or len(value) != 3:
        return None
    try:  # vLLM-Gaudi converts each element with int() (its crash on a non-number is a skipped line here)
        parts = [[int(x) for x in (v if isinstance(v, list) else [v])] for v in value]
    except (TypeError, ValueError, OverflowError):
        return None
    return parts[0], parts[1], parts[2]


def _expand(m: re.Match) -> str:
    start, stop, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if step == 0 or len(range(start, stop, step)) > MAX_RANGE:
        return m.group(0)
    return repr(list(range(start, stop, step)))


__all__ = ["BucketFile", "BucketFileError", "parse", "read"]
