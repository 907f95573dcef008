"""Serving compiled graphs: the compile session every front end hands its graphs to, per-call dispatch to
shape buckets, keys, the recipe store, stored programs, the device's memory counters and CPU-fallback
reporting."""
