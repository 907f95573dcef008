"""Gaudi's runtime APIs under their Gaudi names, so that a Gaudi script runs against the simulator.

The README's table "Gaudi API → hpu_backend" maps each ``habana_frameworks.torch`` name to the one here.
"""

from .distributed import register_hccl  # importing it registers init_process_group(backend="hccl")
from .graphs import wrap_in_hpu_graph
from .memory import max_memory_allocated, memory_allocated, memory_stats, reset_peak_memory_stats
from .mixed_precision import autocast
from .sdpa import FusedSDPA
from .training import FusedAdamW, FusedClipNorm, FusedSGD, mark_step

__all__ = ["FusedAdamW", "FusedClipNorm", "FusedSDPA", "FusedSGD", "autocast", "mark_step", "max_memory_allocated",
           "memory_allocated", "memory_stats", "register_hccl", "reset_peak_memory_stats", "wrap_in_hpu_graph"]
