"""Ahead-of-time tools over a model file: plain functions that take configuration objects and
return dataclasses (the CLI only parses arguments and renders what they return)."""

from .package import PackageReport, build_package, export_model

__all__ = ["PackageReport", "build_package", "export_model"]
