"""The torch-free data formats: recipes, programs, packages, symbolic expressions and key parts.

Everything here reads and writes plain msgpack data and imports neither torch nor anything above it,
so that the cache-only commands of ``hpurecipe`` can read what is stored without importing torch.
"""
