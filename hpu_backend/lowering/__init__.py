"""Lowering: aten FX graph → Recipe (the pipeline is in ``pipeline.py``; passes in ``passes/``)."""

from .context import LoweringContext
from .errors import LoweringError
from .passes.capture import constant_of, encode_guards, recorded_annotations, symbol_table
from .pipeline import BUCKET_PASSES, GRAPH_PASSES, Lowered, capture_graph, lower, lower_bucket, lower_graph

__all__ = ["LoweringContext", "LoweringError", "Lowered", "lower", "capture_graph", "lower_graph", "lower_bucket",
           "constant_of", "encode_guards", "recorded_annotations", "symbol_table",
           "GRAPH_PASSES", "BUCKET_PASSES"]
