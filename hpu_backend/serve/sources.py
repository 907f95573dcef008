"""Where a source line lives: the user's own code, or a library's (site-packages, the standard library, torch,
transformers, this backend), so that advice about a line of library code says so and names the user's frame.

Recipes store a node's file relative to the working directory or to the ``sys.path`` entry that holds it
(``transformers/integrations/sdpa_attention.py``); Dynamo's frames carry absolute paths. Both are resolved
here against the same roots, reading only the file system's names (no import, no file contents).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

_PACKAGE_DIRS = ("site-packages", "dist-packages")


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(str(Path(__file__).resolve().parents[1]))  # hpu_backend itself: its frames are not the user's
    return tuple(sorted(os.path.realpath(r) for r in roots if r))


def library_file(path: str) -> str:
    """``path`` (absolute, or relative as a recipe stores it) relative to the library root holding it
    (``transformers/utils/generic.py``, ``torch/nn/modules/conv.py``), or "" when it is the user's own file."""
    for candidate in _candidates(path):
        real = os.path.realpath(candidate)
        parts = Path(real).parts
        for i, part in enumerate(parts):
            if part in _PACKAGE_DIRS:
                return "/".join(parts[i + 1:])
        for root in _library_roots():
            if real.startswith(root + os.sep):
                base = Path(root).name if root.endswith("hpu_backend") else ""
                return "/".join(p for p in (base, os.path.relpath(real, root)) if p)
    return ""


def _candidates(path: str) -> list[str]:
    if os.path.isabs(path):
        return [path]
    roots = [os.getcwd(), *(p for p in sys.path if os.path.isabs(p))]
    return [c for r in roots if os.path.isfile(c := os.path.join(r, path))][:1]


def library_location(source: str) -> str:
    """A "file:line" location as ``library_file`` names it ("transformers/utils/generic.py:1036"), or ""
    for the user's own code (or a location without a file)."""
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit():
        return ""
    found = library_file(path)
    return f"{found}:{line}" if found else ""
