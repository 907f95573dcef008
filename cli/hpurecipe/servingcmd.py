"""``hpurecipe serving-plan``: plan a vLLM-Gaudi deployment of a model (a model file or a Hugging Face config.json)
without a device; parsing and rendering only (the arguments, their checks and the plan are
``hpu_backend.planning.serving``: ``arguments.py``). ``warm --serving-plan`` warms a plan's buckets.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from hpu_backend.settings import TARGETS

from . import render
from .errors import UsageError
from .options import Json, ModelFile, bounded, target_option


# The options of serving-plan: vllm serve's engine arguments, the bucket variables, and the trace to replay.
MaxModelLen = Annotated[int, typer.Option("--max-model-len",
                                          help="vLLM's --max-model-len: the longest sequence served.")]
Cards = Annotated[int, typer.Option(callback=bounded("--cards"), help="Tensor-parallel cards (1-8).")]
BatchedTokens = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", help="Prompt tokens per step (default: 2048, vllm serve's on HPU).",
    show_default=False)]
MemoryShare = Annotated[float, typer.Option(
    "--gpu-memory-utilization", help="Share of the memory free after the weights that is used.")]
PrefixCaching = Annotated[bool, typer.Option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    help="vLLM's prefix caching (on by default; off turns vLLM-Gaudi's contiguous PA on).")]
BlocksOverride = Annotated[Optional[int], typer.Option(
    "--num-gpu-blocks-override", help="KV-cache blocks, instead of those the memory gives.", show_default=False)]
Release = Annotated[str, typer.Option(
    "--vllm-gaudi", help="The vllm-gaudi release whose bucketing to follow: main (091bbad), v0.27.0rc0 or "
    "main@c799e57 (2026-01-02, the grid PR #762 counted).")]
Env = Annotated[Optional[list[str]], typer.Option(
    "--env", "-e", help="A bucket variable VAR=VALUE (repeatable; over the process environment's VLLM_*), "
    "e.g. VLLM_BUCKETING_STRATEGY=lin.", show_default=False)]
Trace = Annotated[Optional[Path], typer.Option(
    help="Request trace, JSONL: arrival (s), prompt_tokens, output_tokens per line.", show_default=False)]
Requests = Annotated[Optional[int], typer.Option(
    help="A synthetic trace of this many requests (Poisson arrivals at --rate).", show_default=False)]
PromptLen = Annotated[str, typer.Option("--prompt-len", help="Synthetic trace: prompt tokens LOW:HIGH.")]
OutputLen = Annotated[str, typer.Option("--output-len", help="Synthetic trace: output tokens LOW:HIGH.")]
WarmupBudget = Annotated[Optional[float], typer.Option(
    "--warmup-budget", help="Recommend the bucket settings with the least padding for the trace whose cold "
    "warm-up takes at most S seconds.", show_default=False)]
Plot = Annotated[Optional[Path], typer.Option(help="Draw the bucket grid over the trace's shapes (PNG).",
                                              show_default=False)]
Buckets = Annotated[bool, typer.Option("--buckets", help="List every bucket: estimated step time, "
                                       "activation memory, warm-up cold and cached.")]


def serving_plan(
        model: ModelFile, max_model_len: MaxModelLen,
        target: Annotated[str, target_option("Device")] = TARGETS[0], cards: Cards = 1,
        dtype: Annotated[str, typer.Option(help="bf16, or fp8.")] = "bf16",
        block_size: Annotated[int, typer.Option("--block-size", help="KV-cache block size in tokens.")] = 128,
        max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="Most sequences running at once.")] = 256,
        max_num_batched_tokens: BatchedTokens = None, gpu_memory_utilization: MemoryShare = 0.9,
        enable_prefix_caching: PrefixCaching = True, num_gpu_blocks_override: BlocksOverride = None,
        vllm_gaudi: Release = "main", env: Env = None, trace: Trace = None, requests: Requests = None,
        rate: Annotated[float, typer.Option(help="Synthetic trace: requests per second.")] = 4.0,
        prompt_len: PromptLen = "128:1024", output_len: OutputLen = "64:512", warmup_budget: WarmupBudget = None,
        plot: Plot = None, buckets: Buckets = False,
        json: Json = False) -> None:
    """Plan serving MODEL with vLLM-Gaudi: its bucket grid, memory (weights, activations, KV-cache blocks,
    concurrent sequences), warm-up time cold and from a recipe cache, and with a trace: throughput, TTFT/TPOT,
    padding waste, recompiles after warm-up and the recommended bucket settings. All estimates; no device."""
    from hpu_backend.planning.serving.arguments import ServingArgs, ServingArgsError, plan_serving

    args = ServingArgs(
        model=model, max_model_len=max_model_len, target=target, cards=cards, dtype=dtype, block_size=block_size,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
        num_gpu_blocks_override=num_gpu_blocks_override, vllm_gaudi=vllm_gaudi, env=tuple(env or ()), trace=trace,
        requests=requests, rate=rate, prompt_len=prompt_len, output_len=output_len, warmup_budget=warmup_budget)
    try:
        with _progress(json) as say:
            doc, reqs = plan_serving(args, say)
    except ServingArgsError as e:
        raise UsageError(str(e)) from None
    if plot is not None:
        _plot(doc, reqs, plot)
    if json:
        render.emit_json(doc)
    else:
        from .servingview import print_plan

        print_plan(doc, buckets)


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator:
    """A status line on stderr naming the stage, on a terminal and without --json."""
    if quiet or not render.err_console.is_terminal:
        yield lambda _: None
        return
    with render.err_console.status("planning...") as status:
        yield lambda text: status.update(text + "...")


def _plot(doc: dict, reqs, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'hpu_backend[bench]'") from None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5))
    lengths = sorted({q for _, q, _ in doc["grid"]["prompt"]})
    if reqs:
        top.hist([r.prompt for r in reqs], bins=60, color="tab:gray", label="trace prompts")
    for x in lengths:
        top.axvline(x, color="tab:blue", lw=0.8)
    top.set(xlabel="prompt tokens", ylabel="requests", title=f"{doc['model']}: prompt query buckets (blue)")
    blocks = sorted({k for _, _, k in doc["grid"]["decode"]})
    seen = doc.get("trace", {}).get("decode_blocks", {})
    if seen.get("blocks"):
        bottom.hist(seen["blocks"], weights=seen["steps"], bins=60, color="tab:gray", label="decode steps")
    for k in blocks:
        bottom.axvline(k, color="tab:orange", lw=0.8)
    bottom.set(xlabel="KV blocks of a decode batch", ylabel="steps", title="decode block buckets (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def warm_plan(model: str, plan_path: Path, cache_dir, timeout, json: bool) -> None:
    """``hpurecipe warm MODEL --serving-plan PLAN``: the plan's prompt buckets through the prefill step and its
    decode buckets through the decode step, compiled and run once each, filling the cache (one manifest each)."""
    from hpu_backend.modelfiles.modelfile import load_model_file
    from hpu_backend.modelfiles.modelspec import time_limit
    from hpu_backend.planning.serving.arguments import ServingArgsError, read_plan
    from hpu_backend.planning.serving.plan import PlanError
    from hpu_backend.shipping.cachepolicy import config_to_fill
    from hpu_backend.shipping.warm import warm

    from .warmreport import finish, progress

    try:
        prompt, decode = read_plan(plan_path)
    except ServingArgsError as e:
        raise UsageError(str(e)) from None
    with time_limit(timeout, model):
        spec = load_model_file(model)
        if spec.decode is None:
            raise PlanError(f"{model}: no DECODE step; a serving plan warms a prefill and a decode step")
        config = config_to_fill(cache_dir, "warm")
        docs = {}
        for name, step, points in (("prompt", spec, prompt), ("decode", spec.decode, decode)):
            with progress(len(points), json) as on_point:
                report = warm(step, config, on_point=on_point, points=points)
            if json:  # one document for both steps
                docs[name] = {**report.to_dict(), "manifest": report.manifest}
                _kept(report, config)
            else:
                finish(report, config, False, False)
    if json:
        render.emit_json(docs)


def _kept(report, config) -> None:
    """What ``warm`` says when the cache did not keep what the buckets use (failing when it kept none)."""
    from .errors import fail
    from .warmreport import not_kept

    for warning in report.warnings:
        render.warn(warning)
    if report.fit is not None and not report.fit.fits:
        if report.fit.stored_nothing:
            raise fail(not_kept(report.fit, config))
        render.warn(not_kept(report.fit, config))
