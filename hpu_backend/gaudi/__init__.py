"""Gaudi's runtime APIs under their Gaudi names, so that a Gaudi script runs against the simulator.

The README's table "Gaudi API → hpu_backend" maps each ``habana_frameworks.torch`` name to the one here.
Importing this package changes nothing in the process: ``register_hccl()`` registers ``backend="hccl"`` (as
importing Intel's ``distributed.hccl`` does), and the device starts with ``hpu_backend.device.enable()``.
"""

from ..device.module import max_memory_allocated, memory_allocated, memory_stats, reset_peak_memory_stats
from .distributed import register_hccl
from .graphs import wrap_in_hpu_graph
from .lazy_mode import LazyReport, is_lazy, lazy, lazy_report
from .mixed_precision import autocast
from .sdpa import FusedSDPA, enable_recompute_sdp, recompute_sdp_enabled, sdp_kernel
from .training import FusedAdamW, FusedClipNorm, FusedSGD, mark_step

__all__ = ["FusedAdamW", "FusedClipNorm", "FusedSDPA", "FusedSGD", "LazyReport", "autocast", "enable_recompute_sdp",
           "is_lazy", "lazy", "lazy_report", "mark_step", "max_memory_allocated", "memory_allocated", "memory_stats",
           "recompute_sdp_enabled", "register_hccl", "reset_peak_memory_stats", "sdp_kernel", "wrap_in_hpu_graph"]
