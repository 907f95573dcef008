"""Test environment only (on PYTHONPATH of the client scripts the tests run): lets PyPI's torchvision import on
torch's CPU build.

Optimum Habana imports ``torchvision.transforms`` while it loads its model patches. PyPI's only torchvision
wheel for torch 2.13 is a CUDA build: its operator library cannot load next to CPU torch, and torchvision's
import then fails registering fake kernels for two operators that were never defined (``nms``, ``qnms``).
Defining those two schemas first (no kernels: nothing here calls them) lets the pure-Python part import, as
torchvision's CPU build would. Nothing happens unless ``torchvision`` is imported.
"""

import importlib.abc
import importlib.metadata
import sys

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_kept = []  # the Library must outlive this call, or its definitions go with it


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_missing_ops()
        return None  # the real finders import torchvision


def _define_missing_ops() -> None:
    import torch

    cuda_wheel = "+cpu" not in importlib.metadata.version("torchvision") and torch.version.cuda is None
    if cuda_wheel:
        lib = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            lib.define(schema)
        _kept.append(lib)


sys.meta_path.insert(0, _BeforeTorchvision())
