"""What a deployment takes, built before it starts: warm-ups and prebuilds into a recipe cache (``warm.py``, with
``reports.py``, ``cachefit.py``, ``coverage.py``, ``manifests.py``), packages (``package.py``), precompiled
artifacts (``precompile.py``, ``precompiled.py``), bundles (``bundles.py``), the fleet tier (``fleet.py``) and the
cache configuration the tools use (``cachepolicy.py``). Plain functions over a ``ModelSpec`` and a
``CacheConfig`` that return data; the CLI renders it."""
