"""Intel's autocalc (vllm-gaudi .cd/server/vllm_autocalc_rules.py) as the plan restates it: one deployment worked
through its rules by hand."""

from __future__ import annotations

import pytest

from hpu_backend.planning.serving import autocalc

GIB = 1 << 30


def test_an_8b_on_a_96_gib_card_by_hand():
    # 96 GiB, 16 GiB of weights: 96 - 2 - 16 = 78 GiB usable; 128 KiB of KV a token x 4096 = 0.5 GiB a sequence;
    # 78 x 0.9 / 0.5 = 140.4 sequences, x 4096 / 128 = 4492.8 blocks: decode ramps 1 + 8 and 1 + 13 = 126,
    # halved without contiguous PA: 63. Prompt: 1 batch x (1 + 11) lengths x (ceil(log2 31) + ceil(log2 16)) / 2
    # = 12 x 4.5 = 54. Memory 540 + 630 MB; the decode share 630 / 1024 -> 0.62 GB over 78 x 0.9 x (1 - 540/1170)
    # = 37.8 GB -> 0.0164, rounded up to 0.02; KV 78 x 0.9 x 0.98 = 68.8 GB / 0.5 = 137.6 -> 128 (steps of 32)
    auto = autocalc.estimate(96 * GIB, 16 * GIB, 128 * 1024, 1, 4096, 128, 2048, 1, 0.9, contiguous_pa=False)
    assert auto["est_max_num_seqs"] == pytest.approx(140.4)
    assert auto["est_hpu_blocks"] == pytest.approx(4492.8)
    assert (auto["prompt_graphs"], auto["decode_graphs"]) == (54, 63)
    assert auto["graph_memory_bytes"] == (540 + 630) << 20
    assert auto["VLLM_GRAPH_RESERVED_MEM"] == 0.02
    assert auto["max_num_seqs"] == 128
    notes = autocalc.compare(auto, graphs=109, graph_reserved_mem=0.1, max_num_seqs=256, concurrent=131)
    assert [n.split(":")[0] for n in notes] == ["graphs", "VLLM_GRAPH_RESERVED_MEM", "max_num_seqs"]
    assert autocalc.compare(auto, 117, 0.02, 128, 128) == []  # nothing differs, nothing said


def test_contiguous_pa_counts_every_decode_graph_and_a_small_fit_is_a_power_of_two():
    auto = autocalc.estimate(96 * GIB, 16 * GIB, 128 * 1024, 1, 4096, 128, 2048, 1, 0.9, contiguous_pa=True)
    assert auto["decode_graphs"] == 126
    # 78 GiB at 0.9 over 4 GiB a sequence (32768 tokens): 17.55 fit, 17.02 after the reserve of 0.03 -> 16
    long = autocalc.estimate(96 * GIB, 16 * GIB, 128 * 1024, 1, 32768, 128, 2048, 1, 0.9, contiguous_pa=True)
    assert long["max_num_seqs"] == 16
