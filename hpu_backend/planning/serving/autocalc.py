"""What Intel's offline helper in the vLLM-Gaudi image would set for a deployment (torch-free), to print beside
the plan: ``.cd/server/vllm_autocalc_rules.py`` of vllm-project/vllm-gaudi (main@091bbad), its rules for the
default exponential bucketing and the torch.compile mode, restated here (no code of it is used).

It estimates the graph count from ramps of powers of two over its own estimates of the sequences and KV blocks
that fit (halved without contiguous PA), reserves ``APPROX_MEM_PER_GRAPH_MB`` per graph, sets
``VLLM_GRAPH_RESERVED_MEM`` from the decode graphs' share (between 0.01 and 0.1) and ``max_num_seqs`` from the KV
cache that leaves (rounded down to a multiple of the decode batch step). It gives no time and checks no step.
The constants are the values ``settings_vllm.csv`` gives most models.
"""

from __future__ import annotations

import math
from typing import Any

GIB = 1 << 30
UNAVAILABLE_GB = 2.0  # UNAVAILABLE_MEM_ABS
MB_PER_GRAPH = 10.0  # APPROX_MEM_PER_GRAPH_MB (5 to 20 across the CSV; 10 for most models)
DECODE_BS_STEP = 32  # VLLM_DECODE_BS_BUCKET_STEP
QUERY_MIN = 128  # VLLM_PROMPT_QUERY_BUCKET_MIN


def _ramp(n: float) -> int:
    return 1 + math.ceil(math.log2(n))


def estimate(hbm: int, weights_per_card: int, kv_bytes_per_token: float, cards: int, max_model_len: int,
             block_size: int, batched_tokens: int, prefill_seqs: int, gpu_memory_utilization: float,
             contiguous_pa: bool, max_num_seqs: int | None = None) -> dict[str, Any]:
    """The autocalc's figures (memory in GiB as it counts it, 2^30 bytes)."""
    usable = hbm / GIB - UNAVAILABLE_GB - weights_per_card / GIB
    per_seq = max_model_len * kv_bytes_per_token * cards / GIB  # the whole model's KV, as the rules count it
    seqs = max(1.0, cards * usable * gpu_memory_utilization / per_seq)
    blocks = max(1.0, max_model_len * seqs / block_size)
    decode = max(1.0, _ramp(seqs) * _ramp(blocks) / (1 if contiguous_pa else 2))
    prompt = _prompt_graphs(max_model_len, block_size, batched_tokens, prefill_seqs)
    prompt_mb, decode_mb = prompt * MB_PER_GRAPH, decode * MB_PER_GRAPH
    share = prompt_mb / (prompt_mb + decode_mb)
    target_gb = math.ceil(decode_mb / 1024 * 100) / 100
    reserve = math.ceil(target_gb / (usable * gpu_memory_utilization * (1 - share)) * 100) / 100
    reserve = min(max(reserve, 0.01), 0.1)
    kv_gb = usable * gpu_memory_utilization * (1 - reserve)
    return {"graphs": prompt + decode, "prompt_graphs": prompt, "decode_graphs": decode,
            "graph_memory_bytes": round((prompt_mb + decode_mb) * (1 << 20)), "VLLM_GRAPH_RESERVED_MEM": reserve,
            "max_num_seqs": max_num_seqs or _seqs(cards * kv_gb / per_seq), "est_max_num_seqs": seqs,
            "est_hpu_blocks": blocks, "usable_gib": usable}


def _prompt_graphs(max_model_len: int, block_size: int, tokens: int, prefill_seqs: int) -> float:
    bs = _ramp(prefill_seqs)
    flat = bs * _ramp(tokens) / (2 if bs > 1 else 1)
    most = max(1.0, (max_model_len - QUERY_MIN) / block_size)
    least = max(1.0, (max_model_len - tokens) / block_size)
    ctx = (max(1, math.ceil(math.log2(most))) + max(1, math.ceil(math.log2(least)))) / 2
    return max(1.0, flat * ctx)


def _seqs(fit: float) -> int:
    """Rounded down to a multiple of the decode batch step, or to a power of two below it."""
    if fit < DECODE_BS_STEP:
        return 2 ** math.floor(math.log2(fit)) if fit >= 1 else 0
    return max(1, math.floor(fit / DECODE_BS_STEP)) * DECODE_BS_STEP


def compare(auto: dict[str, Any], graphs: int, graph_reserved_mem: float, max_num_seqs: int,
            concurrent: int) -> list[str]:
    """Where the autocalc and the plan differ, and why (one line each)."""
    notes = []
    if round(auto["graphs"]) != graphs:
        notes.append(f"graphs: the autocalc estimates {auto['graphs']:.0f} from power-of-two ramps over its own "
                     f"estimate of {auto['est_max_num_seqs']:.0f} sequences and {auto['est_hpu_blocks']:,.0f} KV "
                     f"blocks; the plan counts the {graphs} buckets vLLM-Gaudi's generator lists")
    if abs(auto["VLLM_GRAPH_RESERVED_MEM"] - graph_reserved_mem) > 1e-9:
        notes.append(f"VLLM_GRAPH_RESERVED_MEM: the autocalc sets {auto['VLLM_GRAPH_RESERVED_MEM']:g} from its "
                     f"decode graphs' memory; the plan keeps {graph_reserved_mem:g} (set it to compare)")
    if auto["max_num_seqs"] != max_num_seqs:
        notes.append(f"max_num_seqs: the autocalc sets {auto['max_num_seqs']} (KV cache / one sequence at "
                     f"max-model-len, in steps of {DECODE_BS_STEP}); the plan serves --max-num-seqs {max_num_seqs}, "
                     f"of which {concurrent} fit the KV cache at once")
    return notes


__all__ = ["compare", "estimate"]
