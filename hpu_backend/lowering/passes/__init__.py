"""Lowering passes, one per file; the order they run in is in ``hpu_backend/lowering/__init__.py``."""
