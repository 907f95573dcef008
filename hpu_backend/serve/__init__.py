"""Serving compiled graphs: per-call dispatch to shape buckets, keys, the recipe store, stored programs,
and CPU-fallback reporting."""
