"""An fp8 serving plan counts the nodes Intel Neural Compressor adds to the graphs Gaudi compiles: a quantize per
activation a matrix op reads, a dequantize per fp8 KV-cache input; the tiny LLaMA's are counted by hand."""

from __future__ import annotations

import pytest

from hpu_backend.planning.capacity import step_graphs
from hpu_backend.modelfiles.modelfile import load_model_file
from hpu_backend.planning.serving import fp8
from hpu_backend.lowering.values import nbytes

LAYERS, BATCH, KV_LEN = 2, 2, 64  # models/llama.py's tiny config: 2 layers, 4 heads of 16, 2 KV heads


@pytest.fixture(scope="module")
def steps():
    return step_graphs(load_model_file("models/llama.py"), "gaudi2", "fp8")


def _added(step, point):
    recipe = step.at(point)
    return recipe, recipe.facts["plan_at"], fp8.added_outputs(recipe, step.params, recipe.facts["plan_at"])


@pytest.mark.e2e
def test_prefill_quantizes_what_each_matrix_op_reads(steps):
    # a layer: the normed input of q/k/v, the fused attention's q, k and v, the o projection's input, the normed
    # input of gate/up, down's input (7); then the head's input (the last position: 2 x 64 fp8 bytes)
    recipe, env, added = _added(steps[0], {"batch": BATCH, "input_len": 16})
    assert len(added) == 7 * LAYERS + 1
    assert added[-1] == BATCH * 64
    assert added[:7] == [BATCH * 16 * 64] * 6 + [BATCH * 16 * 172]  # hidden 64, MLP 172: one byte a value


@pytest.mark.e2e
def test_decode_dequantizes_the_kv_cache_and_quantizes_attention_matmuls(steps):
    # attention is two matmuls (q.k, p.v), each quantizing both inputs: 4 where the fused prefill has 3; and each
    # layer's K and V cache inputs, stored in fp8, are dequantized to bf16 (twice their bytes)
    recipe, env, added = _added(steps[1], {"batch": BATCH, "kv_len": KV_LEN})
    cache = [s for s in recipe.inputs[steps[1].params:] if s.dtype == "float8_e4m3fn"]
    assert len(cache) == 2 * LAYERS
    assert len(added) == 8 * LAYERS + 1 + 2 * LAYERS
    assert added[-2 * LAYERS:] == [2 * nbytes(s, env) for s in cache]
    compiled = fp8.compiled_outputs(recipe, steps[1].params, env)
    assert len(compiled) == len(recipe.nodes) + len(added)
    assert sum(compiled) > sum(nbytes(o, env) for n in recipe.nodes for o in n.out) + sum(added)  # fp8 made in bf16


def test_layers_share_a_compiled_graph_in_bf16_and_not_in_fp8(monkeypatch):
    from hpu_backend.planning.capacity import LayeredStep
    from hpu_backend.planning.serving import model as sm

    # a one-layer and a two-layer graph's measures: a layer adds 60 slices and 30 nodes
    one = {"time_s": 1.0, "activation_bytes": 10, "slices": 100, "nodes": 50, "weights_bytes": 4, "input_bytes": 5,
           "ops": 50}
    two = {**one, "time_s": 1.5, "slices": 160, "nodes": 80, "ops": 80}
    monkeypatch.setattr(sm, "_measure_graph", lambda step, point, sram: step)
    layered = LayeredStep(one, two, 32, 1 << 30)
    measured = {dtype: sm.ServingModel("m", "gaudi2", dtype, 1, layered, layered).measure("prompt", 1, 128)
                for dtype in ("bf16", "fp8")}
    assert measured["bf16"]["slices"] == 160  # the first layer's graph and the one the other 31 share
    assert measured["fp8"]["slices"] == 100 + 31 * 60  # every layer compiled on its own
    assert measured["bf16"]["nodes"] == measured["fp8"]["nodes"] == 50 + 31 * 30  # the bridge builds every layer


def test_runtime_scale_patching_lets_fp8_layers_share_a_graph(monkeypatch):
    from hpu_backend.planning.capacity import LayeredStep
    from hpu_backend.planning.serving import model as sm

    one = {"time_s": 1.0, "activation_bytes": 10, "slices": 100, "nodes": 50, "weights_bytes": 4, "input_bytes": 5,
           "ops": 50}
    two = {**one, "time_s": 1.5, "slices": 160, "nodes": 80, "ops": 80}
    monkeypatch.setattr(sm, "_measure_graph", lambda step, point, sram: step)
    layered = LayeredStep(one, two, 32, 1 << 30)
    patched = sm.ServingModel("m", "gaudi2", "fp8", 1, layered, layered, runtime_scale_patching=True)
    # RUNTIME_SCALE_PATCHING=1: the scales are inputs, so fp8 compiles as bf16 does; the bridge still builds all
    assert patched.measure("prompt", 1, 128)["slices"] == 160
    assert patched.measure("prompt", 1, 128)["nodes"] == 50 + 31 * 30
