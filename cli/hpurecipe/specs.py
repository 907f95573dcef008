"""A model file named on the command line, with its ``--axis NAME=V1,V2`` overrides applied."""

from __future__ import annotations

from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.modelfiles.modelspec import ModelSpec

from .errors import UsageError


def load_spec(model_file: str, axis: list[str] | None) -> ModelSpec:
    """The model file's spec, with ``--axis NAME=V1,V2`` overrides applied."""
    spec = load_model_file(model_file)
    return spec.with_axes(dict(_parse_axis(a) for a in axis)) if axis else spec


def _parse_axis(text: str) -> tuple[str, list[int]]:
    name, _, values = text.partition("=")
    try:
        sizes = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not name.strip() or not sizes:
        raise UsageError(f"--axis {text!r}: expected NAME=V1,V2,... with integer sizes, e.g. seq=16,32")
    return name.strip(), sizes
