"""hpu_backend: a torch.compile backend and ahead-of-time recipe builder for Intel Gaudi (HPU).

``torch.compile(model, backend="hpu_backend")`` works without importing this package (entry
point); so does the alias ``backend="hpu_sim"``, which always names this implementation, even
where Intel's ``habana_frameworks`` has registered ``hpu_backend`` itself.

Importing the package imports nothing heavy: each name below loads its module on first use, so
that a serving process that only calls ``load_package`` never imports Dynamo or AOTAutograd.
"""

from __future__ import annotations

import importlib
from typing import Any

from .version import __version__

_EXPORTS = {
    "hpu_backend": "backend", "Settings": "settings", "SettingsError": "settings",
    "HpuBackendError": "errors",  # the base of every error the project raises
    "autocast": "gaudi.mixed_precision", "simulate": "run.names",
    # planning: what a model needs, before anything is built
    "load_model_file": "modelfiles.modelfile",
    # shipping: the recipes, packages and artifacts a deployment takes
    "warmup": "shipping.warm", "prebuild": "shipping.warm", "plan": "shipping.warm", "WarmReport": "shipping.warm",
    "build_package": "shipping.package", "export_model": "shipping.package", "PackageReport": "shipping.package",
    "read_manifests": "shipping.manifests", "write_manifest": "shipping.manifests", "manifest": "shipping.manifests",
    "load_package": "runtime.packaged", "load_precompiled": "shipping.precompiled", "PackageError": "formats.package",
    # diagnosis: what a model does on the device
    "analyze": "diagnosis.report", "analyze_spec": "diagnosis.analyze",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpu_backend' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
