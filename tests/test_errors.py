"""One base exception: every error class of ours is an HpuBackendError, so ``except HpuBackendError`` catches ours
and nothing else, and each keeps the builtin base its callers catch (ValueError, KeyError, ...)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import hpu_backend
import recipecache
from hpu_backend.errors import HpuBackendError

# Module-private signals (a leading underscore) never leave their module: they are raised and caught inside it.
# Public classes without the base yet, each a reason to fix (the test fails once one has it): none.
NOT_YET: set[str] = set()
SKIPPED_MODULES = ("__main__",)  # a package's ``python -m`` entry runs its command when imported


def _modules():
    import hpurecipe

    for package in (recipecache, hpu_backend, hpurecipe):
        yield package.__name__
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.rpartition(".")[2] not in SKIPPED_MODULES:
                yield info.name


def exception_classes() -> dict[str, type]:
    """Every Exception subclass defined in a module of ours, by its qualified name."""
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == name:
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def test_every_error_of_ours_is_an_hpu_backend_error():
    classes = exception_classes()
    assert len(classes) > 30  # the walk found the modules
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, HpuBackendError) and not cls.__name__.startswith("_"))
    assert outside == sorted(NOT_YET & set(outside))
    stale = sorted(n for n in NOT_YET if n in classes and issubclass(classes[n], HpuBackendError))
    assert stale == [], f"these have the base now; drop them from NOT_YET: {stale}"


@pytest.mark.parametrize("name, builtin", [
    ("hpu_backend.settings.SettingsError", ValueError), ("hpu_backend.metrics.MetricError", KeyError),
    ("hpu_backend.lowering.errors.LoweringError", RuntimeError), ("recipecache.errors.ConfigError", ValueError),
    ("hpu_backend.envs.EnvError", ValueError), ("hpu_backend.serve.keys.Unkeyable", TypeError),
])
def test_an_error_keeps_the_base_its_callers_catch(name, builtin):
    module, _, cls = name.rpartition(".")
    error = getattr(importlib.import_module(module), cls)
    assert issubclass(error, HpuBackendError) and issubclass(error, builtin)


def test_except_hpu_backend_error_catches_ours_and_nothing_else():
    from hpu_backend.settings import Settings

    with pytest.raises(HpuBackendError, match="unknown hpu_backend option"):
        Settings.from_options({"no_such_option": 1})
    with pytest.raises(ValueError):  # a plain ValueError is not ours
        try:
            int("x")
        except HpuBackendError:
            pytest.fail("HpuBackendError caught a ValueError that is not ours")
