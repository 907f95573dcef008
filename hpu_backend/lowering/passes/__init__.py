"""Lowering passes, one per file; the order they run in is in ``hpu_backend/lowering/__init__.py``.

What they leave in ``recipe.facts`` (plain data; sizes and times at the bucket's upper end):

- ``placement``: ``fallbacks`` [{node, op, dtypes, reason, line}] and ``engines`` {engine: count}
- ``clusters``: {count, sizes}; ``transfers``: [{value, to}] (host link crossings)
- ``fusions``: [{id, kind (fused_sdpa | fused_sdpa_bwd | tpc_elementwise | tpc_reduction), nodes, cluster}]
- ``plan_at``: {symbol: value}; ``host_transfers``: {count, bytes, items}
- ``memory`` (estimate): input/output/persistent/intermediate bytes, arena_bytes, peak_live_bytes,
  peak_bytes, on_chip_bytes, workspace_bytes, fits_hbm, buffers [[name, offset, size, first, last]]
- ``cost`` (estimate): target, device_s, cpu_s, transfer_s, total_s, clusters [{id, mme_s, tpc_s,
  hbm_s, hbm_bytes, flops, bound, time_s}], efficiency {mme, tpc, hbm, host}, sources, note
"""
