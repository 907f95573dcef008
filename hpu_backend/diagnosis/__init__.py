"""What a model does on the device, read from its lowered recipes: ``report.py`` (``hpu_backend.analyze()``),
``analyze.py`` (per-bucket analysis, the largest batch that fits), ``advise.py`` and ``timeline_advice.py`` (the
checklist and its timeline findings), ``step_memory.py`` (what a training step holds beyond its graphs)."""
