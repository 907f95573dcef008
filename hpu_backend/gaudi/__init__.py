"""Gaudi's runtime APIs under their Gaudi names, so that a Gaudi script runs against the simulator.

The README's table "Gaudi API → hpu_backend" maps each ``habana_frameworks.torch`` name to the one here.
"""

from .distributed import register_hccl  # importing it registers init_process_group(backend="hccl")
from .graphs import wrap_in_hpu_graph
from .lazy_mode import LazyReport, is_lazy, lazy, lazy_report
from ..serve.device_memory import max_memory_allocated, memory_allocated, memory_stats, reset_peak_memory_stats
from .mixed_precision import autocast
from .sdpa import FusedSDPA, enable_recompute_sdp, recompute_sdp_enabled, sdp_kernel
from .training import FusedAdamW, FusedClipNorm, FusedSGD, mark_step

__all__ = ["FusedAdamW", "FusedClipNorm", "FusedSDPA", "FusedSGD", "LazyReport", "autocast", "enable_recompute_sdp",
           "is_lazy", "lazy", "lazy_report", "mark_step", "max_memory_allocated", "memory_allocated", "memory_stats",
           "recompute_sdp_enabled", "register_hccl", "reset_peak_memory_stats", "sdp_kernel", "wrap_in_hpu_graph"]
