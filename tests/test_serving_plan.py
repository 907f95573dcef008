"""The serving plan: KV-cache blocks as vLLM-Gaudi allocates them, a trace replay whose batches, recompiles and
latencies are known by hand, the whole plan of a tiny Hugging Face config through the CLI, and every bad input
as one line before any lowering."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import pytest

from cli_helpers import cli, cli_json, one_line
from hpu_backend.planning.serving import buckets as bk
from hpu_backend.planning.serving.plan import PlanError, memory
from hpu_backend.planning.serving.simulate import Costs, replay
from hpu_backend.planning.serving.trace import Request, TraceError, read_jsonl

GIB, MIB = 1 << 30, 1 << 20
CONFIG = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "bos_token_id": 0, "eos_token_id": 1}


@dataclass
class Stub:
    """What memory() reads of a lowered model: weights and KV bytes per token."""

    weights_bytes: int
    kv_bytes_per_token: float
    name: str = "stub"
    target: str = "gaudi2"
    cards: int = 1


def test_kv_blocks_as_vllm_gaudi_sizes_them():
    # hpu_worker.determine_available_memory: 79.16 GiB free after the weights, gpu_memory_utilization 0.5,
    # VLLM_GRAPH_RESERVED_MEM 0.4 -> 23.75 GiB, less one block for the dummy: 1518 blocks of 16 MiB (LLaMA 8B:
    # 32 layers x K,V x 8 heads x 128 x bf16 = 128 KiB a token, 128 tokens a block)
    free = round(79.16 * GIB)
    stub = Stub(weights_bytes=96 * GIB - free, kv_bytes_per_token=128 * 1024)
    engine = bk.Engine(max_model_len=2048, gpu_memory_utilization=0.5, graph_reserved_mem=0.4)
    mem = memory(stub, engine)
    assert mem.block_bytes == 16 * MIB and mem.blocks == 1518
    assert mem.warmup_room == free - 1518 * 16 * MIB  # activations and graphs share what the cache leaves
    assert memory(stub, replace(engine, num_gpu_blocks_override=700)).blocks == 700


def test_a_kv_cache_that_cannot_hold_one_sequence_is_one_line():
    stub = Stub(weights_bytes=95 * GIB, kv_bytes_per_token=128 * 1024)
    with pytest.raises(PlanError, match=r"^KV cache: \d+ blocks .* fewer than the 256 one sequence of "
                                        r"--max-model-len 32768 needs"):
        memory(stub, bk.Engine(max_model_len=32768))
    with pytest.raises(PlanError, match="weights take 200.0 GiB per card, past the 96.0 GiB"):
        memory(Stub(200 * GIB, 1.0), bk.Engine(max_model_len=128))


def test_replay_lists_the_unwarmed_buckets():
    engine = bk.Engine(max_model_len=512, max_num_seqs=4)
    grid = bk.Grid("linear", prompt=((1, 128, 0), (1, 256, 0), (2, 128, 0)), decode=((1, 1, 2), (2, 1, 2)),
                   engine=engine, cache_blocks=64)
    compiled = []

    def compile_s(phase, bucket):
        compiled.append((phase, bucket))
        return 10.0

    costs = Costs(prefill_s=lambda b: 1.0, decode_s=lambda b: 0.5, compile_s=compile_s)
    requests = [Request(0.0, 100, 1),   # (1, 128, 0): warmed; TTFT 1 s
                Request(5.0, 300, 1),   # query 300: past the largest, the fallback (1, 448, 0) compiles; TTFT 11 s
                Request(30.0, 200, 1), Request(30.0, 250, 1),  # (2, 250): none covers it -> (4, 448, 0): batch 2
                # rounds up to a multiple of ceil(2^(1/3)) x 2 = 4, within --max-num-seqs
                Request(50.0, 100, 3)]  # prefill (1, 128, 0), then two decode steps at 1 sequence, 1 block
    out = replay(requests, grid, engine, cache_blocks=64, costs=costs)
    summary = out.summary()
    assert [(u["phase"], u["shape"]) for u in summary["unwarmed"]] == [("prompt", [1, 448, 0]),
                                                                         ("prompt", [4, 448, 0])]
    assert compiled == [("prompt", (1, 448, 0)), ("prompt", (4, 448, 0))]
    assert sorted(out.ttft) == [1.0, 1.0, 11.0, 11.0, 11.0]
    assert out.tpot == [0.5] and out.tokens == 7 and out.seconds == 52.0
    assert summary["buckets"]["decode 1x1x2"] == {"steps": 2, "real": 2, "padded": 4, "waste": 0.5}
    assert summary["buckets"]["prompt 1x128x0"]["real"] == 200 and summary["buckets"]["prompt 1x128x0"]["padded"] == 256


def test_a_prompt_past_the_token_budget_runs_in_chunks_with_context():
    engine = bk.Engine(max_model_len=4096, max_num_batched_tokens=1024)
    grid = bk.generate(engine, 500, {})
    seen = []
    costs = Costs(prefill_s=lambda b: seen.append(b) or 1.0, decode_s=lambda b: 0.5, compile_s=lambda p, b: 0.0)
    replay([Request(0.0, 2500, 1)], grid, engine, cache_blocks=500, costs=costs)
    # 1024 + 1024 + 452 tokens; the second chunk after 8 context blocks, the third after 16
    assert seen == [grid.prompt_bucket(1, 1024, 0), grid.prompt_bucket(1, 1024, 8), grid.prompt_bucket(1, 452, 16)]
    assert [c for _, _, c in seen] == [0, 8, 16] and all(grid.warmed("prompt", b) for b in seen)


def test_trace_lines_are_checked(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
                    '{"arrival": 1, "prompt_tokens": -4, "output_tokens": 5}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: prompt_tokens -4: expected a positive integer"):
        read_jsonl(path)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


@pytest.mark.e2e
def test_plan_of_a_config(config, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    rows = [{"arrival": 0.01 * i, "prompt_tokens": 60 + 4 * i, "output_tokens": 8} for i in range(40)]
    rows.append({"arrival": 1.0, "prompt_tokens": 300, "output_tokens": 4})  # past the prompt buckets
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    env = ["VLLM_BUCKETING_STRATEGY=lin", "VLLM_PROMPT_BS_BUCKET_MAX=4", "VLLM_PROMPT_QUERY_BUCKET_MAX=256",
           "VLLM_PROMPT_CTX_BUCKET_MAX=0", "VLLM_DECODE_BS_BUCKET_MAX=8", "VLLM_DECODE_BLOCK_BUCKET_MIN=1",
           "VLLM_DECODE_BLOCK_BUCKET_STEP=8", "VLLM_DECODE_BLOCK_BUCKET_MAX=64"]
    doc = cli_json("serving-plan", config, "--max-model-len", "512", "--max-num-seqs", "8", "--trace", trace,
                   "--warmup-budget", "60", "--plot", tmp_path / "grid.png", *[a for e in env for a in ("--env", e)])
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    grid = doc["grid"]
    # linear: batches 1..4 by 1 (BS_BUCKET_MAX is also max_num_prefill_seqs), queries 128 and 256, context 0
    assert sorted(map(tuple, grid["prompt"])) == [(b, q, 0) for b in (1, 2, 3, 4) for q in (128, 256)]
    assert doc["vllm_gaudi"]["commit"] == bk.RELEASES["main"].commit and not doc["engine"]["contiguous_pa"]
    assert grid["graphs"] == len(grid["prompt"]) + len(grid["decode"]) == len(doc["buckets"])
    mem = doc["memory"]
    assert mem["block_bytes"] == 128 * 2 * 2 * 2 * 8 * 2  # 128 tokens x 2 layers x K,V x 2 heads x 8 x bf16
    assert mem["kv_blocks"] == mem["kv_cache_bytes"] // mem["block_bytes"]
    assert doc["max_concurrent_seqs"] == 8  # the KV cache holds far more: --max-num-seqs decides
    warm = doc["warmup"]
    assert warm["cold_s"] > warm["cached_s"] > 0 and warm["fits"]
    assert warm["steps"] == {"fits": True, "steps_checked": grid["graphs"], "total": grid["graphs"],
                             "first_oom": None}
    served = doc["trace"]["default"]
    assert served["requests"] == 41 and served["output_tokens"] == 40 * 8 + 4
    assert [u["shape"] for u in served["unwarmed"] if u["phase"] == "prompt"] == [[1, 448, 0]]  # the fallback
    rec = doc["trace"]["recommended"]
    assert rec["warmup"]["cold_s"] <= 60 and rec["env"]["VLLM_BUCKETING_STRATEGY"] == "lin"
    assert not [u for u in rec["unwarmed"] if u["phase"] == "prompt"]  # the recommendation covers the long prompt
    from hpurecipe.servingview import print_plan

    capsys.readouterr()
    print_plan(doc, buckets=True)
    text = capsys.readouterr().out
    assert "recompile after warm-up: prompt 1x448x0" in text and "export VLLM_BUCKETING_STRATEGY=lin" in text
    auto = doc["autocalc"]  # Intel's rules beside the plan: they estimate graphs, the plan lists them
    assert "Intel's autocalc" in text and auto["graphs"] != grid["graphs"]
    assert any(n.startswith("graphs: the autocalc estimates") for n in auto["differences"])
    rows = re.findall(r"^prompt +\d+ +\d+ +\d+ .*(?:KiB|MiB|GiB| B) ", text, re.M)  # with an activation size
    assert len(rows) == len(grid["prompt"])  # one row per prompt bucket


@pytest.mark.parametrize("args, message", [
    (["-e", "VLLM_BUCKETING_STRATEGY=lin", "-e", "VLLM_DECODE_BS_BUCKET_MIN=64", "-e", "VLLM_DECODE_BS_BUCKET_MAX=8"],
     "VLLM_DECODE_BS_BUCKET_MIN=64 is above VLLM_DECODE_BS_BUCKET_MAX=8"),
    (["-e", "VLLM_BUCKETING_STRATEGY=lin", "-e", "VLLM_PROMPT_SEQ_BUCKET_STEP=0"],
     "VLLM_PROMPT_SEQ_BUCKET_STEP=0: expected an integer from 1"),
    (["-e", "VLLM_BUCKETING_STRATEGY=exponential"], "VLLM_BUCKETING_STRATEGY='exponential': expected exp, lin or pad"),
    (["--vllm-gaudi", "v9"], "--vllm-gaudi 'v9': expected main or v0.27.0rc0"),
    (["-e", "VLLM_BUCKETING_FROM_FILE=/nonexistent/buckets.txt"],
     "VLLM_BUCKETING_FROM_FILE=/nonexistent/buckets.txt: not a file"),
    (["-e", "RUNTIME_SCALE_PATCHING=yes"], "RUNTIME_SCALE_PATCHING='yes': expected 0 or 1"),
    (["--num-gpu-blocks-override", "0"], "--num-gpu-blocks-override 0: expected an integer from 1"),
    (["--max-model-len", "4096"], "--max-model-len 4096: past the model's context length 512"),
    (["--requests", "5", "--prompt-len", "100:500"], "request 1: prompt"),
    (["--requests", "5", "--prompt-len", "-3:10"], "--prompt-len '-3:10': expected 1 <= LOW <= HIGH"),
    (["--warmup-budget", "10"], "--warmup-budget recommends settings for a trace"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: expected above 0, at most 1"),
    (["--max-model-len", "0"], "--max-model-len 0: expected an integer from 1 to"),
])
def test_bad_input_is_one_line_before_lowering(config, args, message):
    argv = ["serving-plan", config, *(["--max-model-len", "256"] if "--max-model-len" not in args else []), *args]
    line = one_line(cli(*argv, code=2))
    assert message in line, line


def test_a_plan_read_back_gives_the_points_to_warm():
    from hpu_backend.planning.serving.plan import planned_points

    doc = {"grid": {"prompt": [[1, 128, 0], [4, 256, 0], [4, 256, 7]], "decode": [[2, 1, 3], [8, 1, 8]]},
           "engine": {"block_size": 128}}
    prompt, decode = planned_points(doc)
    # the prefill step has no context input: (4, 256) with 0 or 7 context blocks is one point
    assert prompt == [{"batch": 1, "input_len": 128}, {"batch": 4, "input_len": 256}]
    assert decode == [{"batch": 2, "kv_len": 192}, {"batch": 8, "kv_len": 128}]  # each sequence's share of the blocks
    with pytest.raises(PlanError, match=r"grid.decode: expected at most"):
        planned_points({**doc, "grid": {"prompt": [], "decode": [[1, 1, "x"]]}})
    with pytest.raises(PlanError, match=r"grid.prompt: expected at most .* \[batch, query, blocks\]"):
        planned_points({**doc, "grid": {"prompt": [[1, 128]], "decode": []}})  # a plan of the older two-number form


@pytest.fixture()
def no_lowering(monkeypatch):
    """Lowering fails the test: the checks below must answer from the config alone."""
    from hpu_backend.planning.serving import model as sm

    def lowered(*args, **kwargs):
        raise AssertionError("the model was lowered")

    monkeypatch.setattr(sm, "load", lowered)


def _config(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, **fields}))
    return path


def test_a_model_too_big_for_the_cards_is_one_line_before_lowering(tmp_path, no_lowering):
    # a layer: q and o 16384^2, k and v 16384 x 1024 (8 KV heads of 128), the MLP 3 x 16384 x 53248, two norms;
    # embeddings and head 2 x 96 x 16384, the final norm: in bf16 over 2 cards, 142.5 GiB a card
    big = _config(tmp_path, hidden_size=16384, intermediate_size=53248, num_hidden_layers=48,
                  num_attention_heads=128, num_key_value_heads=8)
    d = 16384
    params = 48 * (2 * d * d + 2 * d * 1024 + 3 * d * 53248 + 2 * d) + 2 * 96 * d + d
    line = one_line(cli("serving-plan", big, "--max-model-len", "256", "--cards", "2", code=2))
    assert f"weights take {params / (1 << 30):.1f} GiB per card, past the 96.0 GiB of a gaudi2 card with " \
           "--cards 2" in line, line


def test_a_kv_cache_that_cannot_hold_one_sequence_is_one_line_before_lowering(tmp_path, no_lowering):
    # 4 layers x K,V x 32 heads x 128 x bf16 = 64 KiB a token: 2M tokens need 128 GiB, more than a card has
    long = _config(tmp_path, hidden_size=4096, intermediate_size=64, num_hidden_layers=4, num_attention_heads=32,
                   num_key_value_heads=32, max_position_embeddings=1 << 21)
    line = one_line(cli("serving-plan", long, "--max-model-len", str(1 << 21), code=2))
    assert "KV cache: one sequence of --max-model-len 2097152 needs 128.0 GiB (16384 blocks of 128 tokens, " \
           "65,536 bytes a token)" in line, line
    # half the length in fp8 needs 32 GiB: the checks pass and lowering begins
    passed = cli("serving-plan", long, "--max-model-len", str(1 << 20), "--dtype", "fp8", code=1)
    assert "the model was lowered" in passed.output, passed.output


@pytest.mark.e2e
def test_warm_from_a_plan_fills_the_cache_with_exactly_its_buckets(config, tmp_path):
    # a plan's JSON as serving-plan --json writes it (the fields warm reads): two prompt buckets, one decode bucket
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"grid": {"prompt": [[1, 16, 0], [2, 16, 0]], "decode": [[2, 1, 1]]},
                                "engine": {"block_size": 16}}))
    cache = tmp_path / "cache"
    warmed = cli_json("warm", config, "--serving-plan", plan, "--cache-dir", cache)
    points = {name: [p["point"] for p in doc["points"]] for name, doc in warmed.items()}
    assert points == {"prompt": [{"batch": 1, "input_len": 16}, {"batch": 2, "input_len": 16}],
                      "decode": [{"batch": 2, "kv_len": 8}]}  # each sequence's share of the bucket's block
    assert all(doc["compiled"] > 0 for doc in warmed.values())
    planned = {k for doc in warmed.values() for p in doc["points"] for k in p["keys"] + p["programs"]}
    stored = {row["key"] for row in cli_json("ls", "--cache-dir", cache)}
    assert stored == planned  # the recipes (and programs) of the plan's buckets, nothing else
