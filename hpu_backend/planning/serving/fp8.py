"""The nodes Intel Neural Compressor's fp8 adds to the graphs vLLM-Gaudi compiles (``--quantization inc
--kv-cache-dtype fp8_inc``), found on a lowered fp8 plan.

INC patches every linear and matmul (``neural_compressor/torch/algorithms/fp8_quant/_quant_common/
helper_modules.py``): the activation a patched module reads goes through a quantize op (a cast to fp8 with the
calibrated per-tensor scale) before the fp8 GEMM, which takes the weight already in fp8 with its scale and
writes bf16. The KV cache is kept in fp8 and dequantized to bf16 when fetched (``PatchedVLLMKVCache``), after
which the attention matmul quantizes it again. The fp8 plan (``lowering/passes/apply_dtype_policy.py``) types
those activations fp8 where they are made, with no op of their own; on Gaudi each quantize and dequantize is a
node the bridge builds and the graph compiler schedules. Weights are quantized once when the model loads, so
they add no node to a step.
"""

from __future__ import annotations

from typing import Mapping

from ...formats.recipe import Recipe
from ...lowering.buffers import alias_roots
from ...lowering.optable import FP8
from ...lowering.values import nbytes, node_refs


# vLLM-Gaudi ends a lazy graph after every decoder layer (VLLM_CONFIG_HIDDEN_LAYERS=1), so in bf16 the identical
# layers after the first are one graph, compiled once per bucket. INC's scale format for LLaMA-style models
# ("scalar", vllm-hpu-extension's default but for Qwen3) writes each layer's own scales into its graph, so in fp8
# every layer is a graph of its own to compile (scale_format "const" lets the layers share graphs again, with
# slower steps: vllm-hpu-extension pull requests 231 and 235).
# RUNTIME_SCALE_PATCHING=1 (vLLM-Gaudi's supported_features.md) passes the scales to the graph at run time instead,
# so the layers share graphs in fp8 too: up to 90% less warm-up, for 5-20% of throughput (not modelled here).
LAYERS_SHARE_GRAPHS = {"bf16": True, "fp8": False}


def layers_share_graphs(dtype: str, runtime_scale_patching: bool = False) -> bool:
    """Whether the decoder layers after the first are one compiled graph."""
    return LAYERS_SHARE_GRAPHS[dtype] or runtime_scale_patching


def compiled_outputs(recipe: Recipe, params: int, env: Mapping[str, int]) -> list[int]:
    """The output bytes of each node Gaudi compiles for ``recipe`` at the shape ``env``: the plan's nodes, those
    the fp8 plan typed fp8 at bf16 (INC makes them in bf16 and quantizes them with a node of its own), and the
    nodes INC adds. A bf16 plan's own nodes, unchanged."""
    wide = [sum(nbytes(o, env) * (2 if o.dtype in FP8 else 1) for o in node.out) for node in recipe.nodes]
    return wide + added_outputs(recipe, params, env)


def added_outputs(recipe: Recipe, params: int, env: Mapping[str, int]) -> list[int]:
    """The output bytes of each node INC adds to ``recipe`` at the shape ``env`` (none for a bf16 graph):
    a quantize per activation a matrix op reads in fp8 (each once, whatever views it is read through), and a
    dequantize to bf16 per fp8 input that is not a weight (the KV cache)."""
    specs = {**dict(zip(recipe.input_names, recipe.inputs)), **{n.name: n.out[0] for n in recipe.nodes if n.out}}
    weights = set(recipe.input_names[:params])
    roots = alias_roots(recipe)
    quantized: dict[str, int] = {}
    for node in recipe.nodes:
        if node.engine != "mme":
            continue
        for ref in node_refs(node):
            spec, root = specs.get(ref), roots.get((ref, 0), (ref, 0))[0]
            if spec is not None and spec.kind == "tensor" and spec.dtype in FP8 and root not in weights:
                quantized.setdefault(root, nbytes(spec, env))
    cache = [2 * nbytes(s, env) for s in recipe.inputs[params:] if s.kind == "tensor" and s.dtype in FP8]
    return list(quantized.values()) + cache


__all__ = ["LAYERS_SHARE_GRAPHS", "added_outputs", "compiled_outputs", "layers_share_graphs"]
