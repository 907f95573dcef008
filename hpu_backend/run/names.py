"""Intel's module names (``habana_frameworks.torch.*``) over this project's implementations, on request only.

``simulate()`` refuses when Intel's real ``habana_frameworks`` is importable (a Gaudi host keeps its own
stack), turns the ``hpu`` device on (``hpu_backend.device.enable``), and appends one finder to
``sys.meta_path`` that answers the names Gaudi scripts import. No package directory of that name exists:
each name is a module object built on first import from the table below, so the import-time effects of
Intel's modules happen at the same moment (``core`` turns the device on in the mode ``PT_HPU_LAZY_MODE``
says; ``distributed.hccl`` registers the ``hccl`` process-group backend). ``habana_frameworks.torch.hpu``
is the very object ``torch.hpu`` is. Nothing here runs on a plain ``import hpu_backend``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Callable

from .. import envs
from ..gaudi import hpu_ops
from . import distribution
from .errors import RunError

ROOT = "habana_frameworks"


def _device():
    from .. import device

    return device


def _hpu_module() -> types.ModuleType:
    """``torch.hpu`` (the device's module), with the Gaudi names the device module leaves to us."""
    import torch

    from .. import gaudi, metrics

    _device().enable()
    hpu = torch.hpu
    from ..gaudi import graphs
    from ..gaudi.graphs import ModuleCacher

    extras = {"wrap_in_hpu_graph": gaudi.wrap_in_hpu_graph, "ModuleCacher": ModuleCacher, "metrics": metrics,
              "graphs": graphs,
              "enable_recompute_sdp": gaudi.enable_recompute_sdp, "recompute_sdp_enabled": gaudi.recompute_sdp_enabled,
              "sdp_kernel": gaudi.sdp_kernel}
    for name, value in extras.items():
        if not hasattr(hpu, name):
            setattr(hpu, name, value)
    return hpu


def _core() -> dict:
    from .. import gaudi

    _device().enable()  # as Intel's core: loading it starts the device (PT_HPU_LAZY_MODE, else the release's default)
    from ..gaudi import intel_utils

    return {"mark_step": gaudi.mark_step, "hpu": _hpu_module(), "is_enabled_weight_permute_pass": _permute_pass,
            "get_device_count": lambda: _hpu_module().device_count(), "hpu_initialize": _no_op,
            "step_closure": intel_utils.step_closure, "hpu_set_env": intel_utils.hpu_set_env}


def _permute_pass() -> bool:
    """The bridge permutes convolution weights itself; scripts that ask skip their own permute (nothing to do
    here: the simulated device keeps torch's layouts)."""
    return True


def _no_op(*args, **kwargs) -> None:
    return None


def _debug() -> dict:
    from .. import metrics

    def fallback_op_count() -> dict:
        stats = dict(metrics.metric_global("cpu_fallback").stats())
        return dict(stats.get("FallbackOps", {}))

    return {"_is_enabled_weight_permute_pass": _permute_pass, "_get_fallback_op_count": fallback_op_count,
            "_enable_weight_permute_pass": _no_op, "_set_module_name": _no_op, "_set_dynamic_mode": _no_op}


def _library_loader() -> dict:
    return {"load_habana_module": lambda: _device().enable(), "is_habana_available": lambda: True}


def _hccl() -> dict:
    from ..gaudi import distributed

    distributed.register_hccl()  # as Intel's hccl module: importing it registers backend="hccl"
    return {"initialize_distributed_hpu": distributed.initialize_distributed_hpu}


def _kernels() -> dict:
    from .. import gaudi
    from ..gaudi import hpex_kernels, rotary

    return {"FusedSDPA": gaudi.FusedSDPA, "CTCLoss": hpex_kernels.CTCLoss,
            "RotaryPosEmbeddingHelperV1": rotary.RotaryPosEmbeddingHelperV1,
            "RotaryPosEmbeddingHelperV2": rotary.RotaryPosEmbeddingHelperV2,
            "RotaryPosEmbeddingHelperV3": rotary.RotaryPosEmbeddingHelperV3,
            "RotaryPosEmbeddingMode": rotary.RotaryPosEmbeddingMode,
            "apply_rotary_pos_emb": rotary.apply_rotary_pos_emb}


def _optimizers() -> dict:
    from .. import gaudi

    return {"FusedAdamW": gaudi.FusedAdamW, "FusedSGD": gaudi.FusedSGD}


def _normalization() -> dict:
    from .. import gaudi

    from ..gaudi import hpex_kernels

    return {"FusedClipNorm": gaudi.FusedClipNorm, "FusedRMSNorm": hpex_kernels.FusedRMSNorm}


def _experimental() -> dict:
    from ..gaudi import intel_utils

    return {"_get_device_type": intel_utils._get_device_type, "synDeviceType": intel_utils.synDeviceType,
            "_is_fp16_supported": intel_utils._is_fp16_supported, "hpu": _hpu_module()}


def _internal() -> dict:
    from ..gaudi import intel_utils

    return {"is_lazy": intel_utils.is_lazy}


def _dataloader() -> dict:
    from ..gaudi import intel_utils

    return {"HabanaDataLoader": intel_utils.HabanaDataLoader}


def _metrics() -> dict:
    from .. import metrics

    return {"metric_global": metrics.metric_global, "metric_localcontext": metrics.metric_localcontext}


def _package() -> dict:
    return {}


def _torch_package() -> dict:
    """``habana_frameworks.torch``: every Intel module below it comes with ``hccl`` registered (DeepSpeed's HPU
    accelerator imports ``habana_frameworks.torch.hpu`` and then initializes ``backend="hccl"`` without importing
    the hccl module)."""
    from ..gaudi import distributed

    distributed.register_hccl()
    return {}


# name -> (is a package, what its module holds). ``hpu`` is torch.hpu itself (see _HpuLoader).
MODULES: dict[str, tuple[bool, Callable[[], dict]]] = {
    ROOT: (True, _package),
    f"{ROOT}.torch": (True, _torch_package),
    f"{ROOT}.torch.core": (True, _core),
    f"{ROOT}.torch.hpu.metrics": (False, _metrics),
    f"{ROOT}.torch.hpex": (True, _package),
    f"{ROOT}.torch.hpex.kernels": (False, _kernels),
    f"{ROOT}.torch.hpex.optimizers": (False, _optimizers),
    f"{ROOT}.torch.hpex.normalization": (False, _normalization),
    f"{ROOT}.torch.utils": (True, _package),
    f"{ROOT}.torch.utils.debug": (False, _debug),
    f"{ROOT}.torch.utils.library_loader": (False, _library_loader),
    f"{ROOT}.torch.utils.experimental": (False, _experimental),
    f"{ROOT}.torch.utils.internal": (False, _internal),
    f"{ROOT}.torch.distributed": (True, _package),
    f"{ROOT}.torch.distributed.hccl": (False, _hccl),
    "habana_dataloader": (False, _dataloader),  # Intel's data loader package: torch's DataLoader here
}
HPU = f"{ROOT}.torch.hpu"


def _hpu_random() -> types.ModuleType:
    _hpu_module()
    from ..device import random

    return random


def _hpu_graphs() -> types.ModuleType:
    _hpu_module()
    from ..gaudi import graphs

    return graphs


# Names that are existing module objects, not built from a table: ``torch.hpu``, its ``random`` and ``graphs``.
ALIASES: dict[str, Callable[[], types.ModuleType]] = {HPU: _hpu_module, f"{HPU}.random": _hpu_random,
                                                      f"{HPU}.graphs": _hpu_graphs}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the names of ``MODULES`` (and ``HPU``) with module objects; every other name is not ours."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname == HPU)
        if fullname in MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=MODULES[fullname][0])
        return None

    def create_module(self, spec):
        alias = ALIASES.get(spec.name)
        return alias() if alias is not None else None  # None: a fresh module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__spec__.name in ALIASES:
            return
        module.__dict__.update(MODULES[module.__spec__.name][1]())
        if module.__spec__.submodule_search_locations is not None:
            module.__getattr__ = _submodules(module.__spec__.name)


def _submodules(package: str) -> Callable[[str], types.ModuleType]:
    """A package's ``__getattr__``: ``habana_frameworks.torch.hpex.kernels`` without importing it first, as the
    bridge's packages import their submodules."""

    def attr(name: str) -> types.ModuleType:
        child = f"{package}.{name}"
        if child not in MODULES and child not in ALIASES:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return importlib.import_module(child)

    return attr


_FINDER = _Finder()


def installed() -> bool:
    return _FINDER in sys.meta_path


def intel_stack() -> str | None:
    """Where Intel's own ``habana_frameworks`` is, if it is importable (our finder set aside), else None."""
    if installed():
        return None
    spec = importlib.util.find_spec(ROOT)
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or ROOT


class SpawnedPath(str):
    """A ``sys.path`` entry (the script's folder) that carries the names into processes ``multiprocessing``
    spawns: the spawn start method (DataLoader workers of Intel's examples) sends the parent's ``sys.path``
    to the child, which unpickles it before importing the script again as ``__mp_main__``; unpickling this
    entry calls ``simulate()`` there first. A plain string everywhere else."""

    def __reduce__(self):
        return _spawned, (str(self),)


def _spawned(path: str) -> str:
    simulate()
    return path


def simulate() -> None:
    """Make ``import habana_frameworks.torch.*`` and ``torch.hpu`` resolve to the simulator (idempotent).

    Raises ``RunError`` (one line) where Intel's ``habana_frameworks`` is installed: there a Gaudi script
    should run on Intel's stack, and the simulator never shadows it."""
    if installed():
        return
    where = intel_stack()
    if where is not None:
        raise RunError(f"Intel's habana_frameworks is installed ({where}): run the script with Python on this "
                       "host; the simulator does not shadow a real Gaudi stack")
    _device().enable()
    sys.meta_path.append(_FINDER)  # last: any real package found by the other finders would come first
    distribution.publish()  # `pip list` and importlib.metadata see habana-torch-plugin, as on a Gaudi host
    hpu_ops.register()  # torch.ops.hpu.*, as Intel's bridge library defines them when it loads
    if envs.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "1":
        # Every simulated release (1.18 on) is loaded by `import torch` (torch's device-backend autoloading):
        # a script may call init_process_group("hccl") without importing Intel's modules first.
        importlib.import_module(f"{ROOT}.torch")
