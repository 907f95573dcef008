"""Gaudi's lazy mode under its names (``htcore.mark_step``, ``lazy_report``): the engine is the device's
(``hpu_backend/device/lazy.py``), its state the device context's (``hpu_backend/device/context.py``).

``with hpu_backend.gaudi.lazy():`` runs a block of host-tensor code lazily; on the hpu device, lazy mode is
the device's mode (``PT_HPU_LAZY_MODE=1`` when it is enabled). Importing this module does nothing.
"""

from ..device.context import is_lazy, lazy, lazy_report, mark_step
from ..device.lazy import KEPT_STEPS, GraphRun, LazyReport, LazyRunner, Step, Sync

__all__ = ["GraphRun", "KEPT_STEPS", "LazyReport", "LazyRunner", "Step", "Sync", "is_lazy", "lazy", "lazy_report",
           "mark_step"]
