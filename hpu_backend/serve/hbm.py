"""A recipe whose planned peak exceeds the target's HBM: one warning per graph when it is taken up to run,
and an error in strict mode, naming the peak, the largest buffers and the remedies of the Gaudi docs.

Compile-only runs (``execute=False``: prebuild, warm-up, capacity planning) plan past HBM on purpose
(the largest-batch search does) and report ``fits_hbm`` instead.
"""

from __future__ import annotations

import logging
import threading

from ..formats.recipe import Recipe
from ..lowering.errors import LoweringError
from ..targets import device

log = logging.getLogger(__name__)

REMEDIES = ("split the graph (hpu_backend.gaudi.mark_step in lazy mode, or a graph break), use "
            "FusedSDPA with recompute for attention, or a smaller batch (Intel Gaudi docs: Usage of "
            "mark_step; Batch Size; FusedSDPA)")

_lock = threading.Lock()
_warned: set[str] = set()


def check(recipe: Recipe, strict: bool) -> None:
    """Warn once per graph (raise in strict mode) when ``recipe``'s planned peak exceeds its target's HBM."""
    memory = recipe.facts.get("memory", {})
    if memory.get("fits_hbm", True):
        return
    text = overflow(recipe)
    if strict:
        raise LoweringError(text, graph=recipe.name)
    with _lock:
        if recipe.name in _warned:
            return
        _warned.add(recipe.name)
    log.warning("hpu_backend: %s", text)


def overflow(recipe: Recipe) -> str:
    """One line: the peak against the HBM, the three largest buffers with their source lines, the remedies."""
    memory, dev = recipe.facts["memory"], device(recipe.target)
    source = {n.name: n.source for n in recipe.nodes}
    largest = sorted(memory.get("buffers", []), key=lambda b: -b[2])[:3]
    named = ", ".join(f"{b[0]} {_gib(b[2])}" + (f" ({src})" if (src := source.get(b[0].split(":")[0])) else "")
                      for b in largest)
    return (f"{recipe.name}: planned peak HBM {_gib(memory['peak_bytes'])} exceeds {dev.name}'s "
            f"{_gib(dev.hbm_bytes)} (an estimate; largest buffers: {named or 'none'}); {REMEDIES}")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
