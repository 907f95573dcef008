"""Device and fabric figures for the cost model and memory plan: one frozen record per target, with sources.

Peak figures are vendor-published numbers; figures the vendor does not publish (FP32 matrix
throughput, TPC peaks for dtypes other than BF16, kernel launch overhead) are derived from the
published ones by the ratios noted next to them. Real kernels sustain a fraction of a peak: one
``Efficiency`` record per engine, the same for every target and model, fitted on published measurements
(``bench/capacity_bench.py``). Every time computed from this table is an estimate, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

TERA = 1e12
GB = 1e9
GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Efficiency:
    """The fraction of each published peak that the cost model assumes real kernels sustain."""

    mme: float
    tpc: float
    hbm: float
    host: float
    sources: tuple[str, ...] = field(default=())


# Fitted with bench/capacity_bench.py: LLaMA 2 7B (models/llama.py:LLAMA2_7B) estimated on gaudi2 in fp8 at
# Intel's six published single-card rows (software 1.18.0; tokens/s at in/out/batch 128/128/1230 -> 13,137,
# 128/2048/163 -> 4,791, 2048/128/94 -> 1,449, 2048/2048/81 -> 1,953; batch-1 latency at input 128 -> 7.62 ms,
# 2048 -> 56.31 ms); the MME and HBM factors minimize the largest |log(estimate / published)|
# over a 0.01 grid. TPC work is under 2% of every row's time there, so the rows cannot fit its factor: it is
# set to the MME factor. No row moves data over the host link; its factor is PCIe's usable share (128b/130b
# encoding and TLP headers at 256-byte payloads leave about 90% of the raw rate; 80% is typical measured).
EFFICIENCY = Efficiency(
    mme=0.61, tpc=0.61, hbm=0.60, host=0.8,
    sources=("efficiency fitted by bench/capacity_bench.py on Intel's Model Performance Data for Intel Gaudi 2 "
             "AI Accelerators (software 1.18.0), LLaMA 2 7B fp8 single-card rows",
             "PCI Express Base Specification 4.0 (128b/130b encoding; TLP overhead)"),
)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    sram_bytes: int
    mme_flops: Mapping[str, float]  # dtype -> peak matrix FLOP/s
    tpc_flops: Mapping[str, float]  # dtype -> peak vector FLOP/s
    host_bytes_per_s: float  # host link (PCIe x16), one direction
    host_latency_s: float = 10e-6  # per host<->device transfer (DMA setup + sync)
    launch_s: float = 5e-6  # per cluster (recipe launch), an assumption
    sources: tuple[str, ...] = field(default=())
    efficiency: Efficiency = EFFICIENCY

    def mme_peak(self, dtype: str) -> float:
        return self.mme_flops.get(dtype, self.mme_flops["float32"])

    def tpc_peak(self, dtype: str) -> float:
        return self.tpc_flops.get(dtype, self.tpc_flops["float32"])


def _per_dtype(bf16: float, fp8: float | None = None, fp32_ratio: float = 0.25) -> Mapping[str, float]:
    """BF16/FP16 at the published peak, FP32 at ``fp32_ratio`` of it, FP8 where published."""
    table = {"bfloat16": bf16, "float16": bf16, "float32": bf16 * fp32_ratio}
    if fp8 is not None:
        table.update({"float8_e4m3fn": fp8, "float8_e5m2": fp8})
    return MappingProxyType(table)


GAUDI2 = DeviceSpec(
    name="gaudi2",
    hbm_bytes=96 * GIB, hbm_bytes_per_s=2.45 * 1e12, sram_bytes=48 * MIB,
    # 432 TFLOPS BF16 / 865 TFLOPS FP8 matrix; FP32 matrix assumed 1/4 of BF16.
    mme_flops=_per_dtype(432 * TERA, fp8=865 * TERA),
    # 11 TFLOPS BF16 vector (24 TPCs); FP32 assumed 1/2 of BF16; integers as FP32.
    tpc_flops=_per_dtype(11 * TERA, fp32_ratio=0.5),
    host_bytes_per_s=32 * GB,  # PCIe Gen4 x16
    sources=("Intel Gaudi 2 AI Accelerator white paper (96 GB HBM2E at 2.45 TB/s, 48 MB SRAM, "
             "24 TPCs, 2 MMEs)",
             "Intel Gaudi 3 AI Accelerator white paper, Table 1 comparison with Gaudi 2 (BF16 MME "
             "432 TFLOPS, FP8 MME 865 TFLOPS, BF16 vector 11 TFLOPS, host interface PCIe Gen4 x16)"),
)

GAUDI3 = DeviceSpec(
    name="gaudi3",
    hbm_bytes=128 * GIB, hbm_bytes_per_s=3.7 * 1e12, sram_bytes=96 * MIB,
    # 1835 TFLOPS BF16 and FP8 matrix; FP32 matrix assumed 1/4 of BF16.
    mme_flops=_per_dtype(1835 * TERA, fp8=1835 * TERA),
    # 28.7 TFLOPS BF16 vector (64 TPCs); FP32 assumed 1/2 of BF16.
    tpc_flops=_per_dtype(28.7 * TERA, fp32_ratio=0.5),
    host_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources=("Intel Gaudi 3 AI Accelerator white paper (128 GB HBM2e at 3.7 TB/s, 96 MB SRAM, "
             "8 MMEs, 64 TPCs, BF16/FP8 MME 1835 TFLOPS, BF16 vector 28.7 TFLOPS)",
             "Intel Gaudi 3 AI Accelerator product brief (PCIe Gen5 x16 host interface)"),
)

# The host that runs CPU-fallback ops: a typical two-socket Xeon server (assumed, not measured).
HOST_FLOPS = 2 * TERA
HOST_BYTES_PER_S = 100 * GB

DEVICES: Mapping[str, DeviceSpec] = MappingProxyType({d.name: d for d in (GAUDI2, GAUDI3)})


def target_problem(target: str) -> str | None:
    """Why ``target`` names none of the devices above (one line, for a --target option), or None."""
    return None if target in DEVICES else f"--target {target!r}: expected {' or '.join(DEVICES)}"


def device(target: str) -> DeviceSpec:
    """The spec for a target name (``gaudi2`` | ``gaudi3``); KeyError names the known ones."""
    try:
        return DEVICES[target]
    except KeyError:
        raise KeyError(f"unknown target {target!r}; known: {', '.join(DEVICES)}") from None


# -- the scale-up fabric: collectives between the cards of one server ----------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Fabric:
    """A card's integrated RoCE ports and how a server wires them: all-to-all between its cards (scale-up).

    ``collective_s`` is the time model of every collective: a bandwidth term (the bytes each card must send,
    spread over the links it has to the group's other cards, at ``efficiency`` of the line rate) plus one
    ``latency_s`` per message a card exchanges. ``algorithm`` "direct" is the all-to-all server: in each phase
    a card sends every peer its share at once over the 3 ports wired to that peer (n - 1 messages, so the
    latency grows with the group while the bandwidth term shrinks); "ring" is the textbook ring (one link per
    direction, n - 1 steps per phase) for fabrics that are not fully connected.
    """

    name: str
    ports: int  # integrated RoCE ports per card
    port_bytes_per_s: float  # one port, one direction
    scale_up_ports: int  # wired to the server's other cards
    scale_out_ports: int  # to the data-center switches
    cards_per_server: int
    efficiency: float  # fraction of the line rate a collective sustains (fitted)
    latency_s: float  # per communication step (fitted)
    # The graph compiler slices a collective and the compute around it into chunks and pipelines them: this
    # fraction of the collective's wire time (not its latency) that the dependency graph leaves exposed still
    # hides behind the cluster's compute (at most the compute's time). Fitted.
    overlap: float = 0.0
    algorithm: str = "direct"
    sources: tuple[str, ...] = field(default=())

    @property
    def ports_per_peer(self) -> int:
        return self.scale_up_ports // (self.cards_per_server - 1)

    def link_bytes_per_s(self) -> float:
        """The usable rate between two cards of a server, one direction."""
        return self.ports_per_peer * self.port_bytes_per_s * self.efficiency

    def scale_up_bytes_per_s(self) -> float:
        """A card's published scale-up rate, one direction (all its scale-up ports)."""
        return self.scale_up_ports * self.port_bytes_per_s

    def collective_s(self, kind: str, nbytes: float, group: int) -> float:
        """Estimated time of one collective over ``group`` cards of a server; ``nbytes`` is the full tensor
        (all_reduce: the tensor reduced; all_gather: the gathered output; reduce_scatter: the input;
        all_to_all: one card's input). ValueError for an unknown kind or a group larger than the server."""
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
        if not 1 <= group <= self.cards_per_server:
            raise ValueError(f"group of {group} cards: the scale-up fabric joins 1 to {self.cards_per_server}")
        if group == 1:
            return 0.0
        phases = 2 if kind == "all_reduce" else 1  # reduce-scatter then all-gather
        share = (group - 1) / group * nbytes  # what each card sends per phase
        if self.algorithm == "ring":
            return phases * (share / self.link_bytes_per_s() + (group - 1) * self.latency_s)
        return phases * (share / ((group - 1) * self.link_bytes_per_s()) + (group - 1) * self.latency_s)


_NETWORK_DOC = ("Intel Gaudi documentation, Management and Monitoring, Intel Gaudi Network Configuration "
                "(docs.habana.ai): 21 scale-up ports wired all-to-all to the 7 other cards of an HLS box, 3 per "
                "peer, and 3 scale-out ports; Gaudi 3 links at 200 Gb/s, Gaudi 2 at 100 Gb/s")
# Fitted with bench/fabric_bench.py on Intel's Model Performance Data for Intel Gaudi 2 (software 1.18.0, fp8):
# LLaMA 2 70B on 2 and 4 cards at in/out/batch 128/128/1750 -> 2,844 tokens/s, 128/2048/327 (4 cards) -> 3,211,
# 2048/128/95 -> 310, 2048/2048/78 -> 1,438, and the 8-card batch-1 first-token latencies (input 128 -> 26.93 ms,
# 2048 -> 116 ms); minimizes the largest |log(estimate / published)|. Other published rows only validate it.
FABRIC_EFFICIENCY = 0.55
FABRIC_LATENCY_S = 12e-6
FABRIC_OVERLAP = 0.0

GAUDI2_FABRIC = Fabric(
    name="gaudi2", ports=24, port_bytes_per_s=100e9 / 8, scale_up_ports=21, scale_out_ports=3, cards_per_server=8,
    efficiency=FABRIC_EFFICIENCY, latency_s=FABRIC_LATENCY_S, overlap=FABRIC_OVERLAP,
    sources=("Intel Gaudi 2 AI Accelerator white paper (24 x 100 GbE RoCE v2 ports integrated on chip)",
             _NETWORK_DOC, "habana.ai/products/networking: HLS-Gaudi2, 8 cards per server, all-to-all scale-up"),
)

GAUDI3_FABRIC = Fabric(
    name="gaudi3", ports=24, port_bytes_per_s=200e9 / 8, scale_up_ports=21, scale_out_ports=3, cards_per_server=8,
    efficiency=FABRIC_EFFICIENCY, latency_s=FABRIC_LATENCY_S, overlap=FABRIC_OVERLAP,
    sources=("Intel Gaudi 3 AI Accelerator white paper (24 x 200 GbE RoCE v2 ports integrated on chip)",
             _NETWORK_DOC),
)

FABRICS: Mapping[str, Fabric] = MappingProxyType({f.name: f for f in (GAUDI2_FABRIC, GAUDI3_FABRIC)})


def fabric(target: str) -> Fabric:
    """The scale-up fabric of a target's server (``gaudi2`` | ``gaudi3``); KeyError names the known ones."""
    try:
        return FABRICS[target]
    except KeyError:
        raise KeyError(f"unknown target {target!r}; known: {', '.join(FABRICS)}") from None


def layout_problem(target: str, cards: int, tp: int = 1, global_batch: int | None = None) -> str | None:
    """Why ``cards`` of one ``target`` server cannot hold a tensor-parallel degree ``tp`` and split
    ``global_batch`` over its data-parallel cards, or None. Plain arithmetic, no model: the command line checks
    it before any model loads, and the planners check it again for callers from Python."""
    server = fabric(target).cards_per_server
    if not 1 <= cards <= server:
        return f"--cards {cards}: a {target} server joins 1 to {server} cards (no scale-out yet)"
    if cards % tp:
        return f"--tp {tp} does not divide --cards {cards}"
    if global_batch is not None and global_batch % (cards // tp):
        return f"global batch {global_batch} does not split over {cards // tp} data-parallel cards"
    return None
