"""hpu_backend: a torch.compile backend and ahead-of-time recipe builder for Intel Gaudi (HPU).

``torch.compile(model, backend="hpu_backend")`` works without importing this package (entry
point). Importing it also registers the alias ``hpu_sim``, which always names this
implementation, even where Intel's ``habana_frameworks`` has registered ``hpu_backend`` itself.
"""

from __future__ import annotations

import logging

from .version import __version__

log = logging.getLogger(__name__)


def _register_alias() -> None:
    from torch._dynamo.backends import registry

    from .backend import hpu_backend

    if "hpu_sim" not in registry._COMPILER_FNS:
        registry.register_backend(hpu_backend, name="hpu_sim")
    # "hpu_backend" itself comes from the entry point, loaded lazily by torch; registering it here
    # too would collide with that load (or with habana_frameworks, if it got there first).
    other = registry._COMPILER_FNS.get("hpu_backend")
    log.debug("backend 'hpu_backend' resolves to %s",
              "this package (entry point)" if other in (None, hpu_backend) else f"{other.__module__}.{other.__name__}")


_register_alias()

from .analysis import analyze  # noqa: E402
from .backend import hpu_backend  # noqa: E402
from .settings import Settings, SettingsError  # noqa: E402
from .modelfile import load_model_file  # noqa: E402
from .warmup import warmup  # noqa: E402

__all__ = ["analyze", "hpu_backend", "Settings", "SettingsError", "load_model_file", "warmup", "__version__"]
