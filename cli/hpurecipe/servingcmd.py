"""``hpurecipe serving-plan``: plan a vLLM-Gaudi deployment of a model (a model file or a Hugging Face config.json)
without a device; argument checking and rendering only (the plan is ``hpu_backend.planning.serving``).

Every input is checked before the model is lowered: the engine arguments, the bucket variables (the process
environment's ``VLLM_*``, then ``--env``), the trace against --max-model-len and the config's context length, and
(a config) the weights and one sequence's KV cache against the cards.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from hpu_backend.settings import TARGETS

from . import render
from .errors import UsageError
from .options import Json, ModelFile, bounded

DTYPES = ("bf16", "fp8")


def serving_plan(
        model: ModelFile,
        max_model_len: Annotated[int, typer.Option("--max-model-len",
                                                   help="vLLM's --max-model-len: the longest sequence served.")],
        target: Annotated[str, typer.Option(help=f"Device: {' or '.join(TARGETS)}.")] = TARGETS[0],
        cards: Annotated[int, typer.Option(callback=bounded("--cards"), help="Tensor-parallel cards (1-8).")] = 1,
        dtype: Annotated[str, typer.Option(help="bf16, or fp8.")] = "bf16",
        block_size: Annotated[int, typer.Option("--block-size", help="KV-cache block size in tokens.")] = 128,
        max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="Most sequences running at once.")] = 256,
        max_num_batched_tokens: Annotated[Optional[int], typer.Option(
            "--max-num-batched-tokens", help="Prompt tokens per step (default: 2048, vllm serve's on HPU).",
            show_default=False)] = None,
        gpu_memory_utilization: Annotated[float, typer.Option(
            "--gpu-memory-utilization", help="Share of the memory free after the weights that is used.")
        ] = 0.9,
        enable_prefix_caching: Annotated[bool, typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="vLLM's prefix caching (on by default; off turns vLLM-Gaudi's contiguous PA on).")] = True,
        num_gpu_blocks_override: Annotated[Optional[int], typer.Option(
            "--num-gpu-blocks-override", help="KV-cache blocks, instead of those the memory gives.",
            show_default=False)] = None,
        vllm_gaudi: Annotated[str, typer.Option(
            "--vllm-gaudi", help="The vllm-gaudi release whose bucketing to follow: main (091bbad), v0.27.0rc0 or "
            "main@c799e57 (2026-01-02, the grid PR #762 counted).")
        ] = "main",
        env: Annotated[Optional[list[str]], typer.Option(
            "--env", "-e", help="A bucket variable VAR=VALUE (repeatable; over the process environment's VLLM_*), "
            "e.g. VLLM_BUCKETING_STRATEGY=lin.", show_default=False)] = None,
        trace: Annotated[Optional[Path], typer.Option(
            help="Request trace, JSONL: arrival (s), prompt_tokens, output_tokens per line.", show_default=False)
        ] = None,
        requests: Annotated[Optional[int], typer.Option(
            help="A synthetic trace of this many requests (Poisson arrivals at --rate).", show_default=False)] = None,
        rate: Annotated[float, typer.Option(help="Synthetic trace: requests per second.")] = 4.0,
        prompt_len: Annotated[str, typer.Option("--prompt-len", help="Synthetic trace: prompt tokens LOW:HIGH.")
                              ] = "128:1024",
        output_len: Annotated[str, typer.Option("--output-len", help="Synthetic trace: output tokens LOW:HIGH.")
                              ] = "64:512",
        warmup_budget: Annotated[Optional[float], typer.Option(
            "--warmup-budget", help="Recommend the bucket settings with the least padding for the trace whose cold "
            "warm-up takes at most S seconds.", show_default=False)] = None,
        plot: Annotated[Optional[Path], typer.Option(help="Draw the bucket grid over the trace's shapes (PNG).",
                                                     show_default=False)] = None,
        buckets: Annotated[bool, typer.Option("--buckets", help="List every bucket: estimated step time, "
                                              "activation memory, warm-up cold and cached.")] = False,
        json: Json = False) -> None:
    """Plan serving MODEL with vLLM-Gaudi: its bucket grid, memory (weights, activations, KV-cache blocks,
    concurrent sequences), warm-up time cold and from a recipe cache, and with a trace: throughput, TTFT/TPOT,
    padding waste, recompiles after warm-up and the recommended bucket settings. All estimates; no device."""
    from hpu_backend.planning.serving import buckets as bk
    from hpu_backend.planning.serving import trace as tr

    engine, variables, reqs, context = _checked(model, max_model_len, target, cards, dtype, block_size, max_num_seqs,
                                                max_num_batched_tokens, gpu_memory_utilization, env, trace, requests,
                                                rate, prompt_len, output_len, warmup_budget,
                                                (enable_prefix_caching, num_gpu_blocks_override, vllm_gaudi))
    from hpu_backend.modelfiles.modelfile import load_model_file
    from hpu_backend.planning.serving import model as sm
    from hpu_backend.planning.serving.plan import plan

    with _progress(json) as say:
        say("lowering the prefill and decode steps")
        served = sm.load(load_model_file(model), target, dtype, cards, _scale_patching(env))
        try:
            doc = plan(served, engine, variables, reqs, warmup_budget, say)
        except (bk.BucketSettingError, tr.TraceError) as e:
            raise UsageError(str(e)) from None
    doc["context_length"] = context
    if plot is not None:
        _plot(doc, reqs, plot)
    if json:
        render.emit_json(doc)
    else:
        from .servingview import print_plan

        print_plan(doc, buckets)


def _checked(model, max_model_len, target, cards, dtype, block_size, max_num_seqs, max_num_batched_tokens,
             gpu_memory_utilization, env, trace, requests, rate, prompt_len, output_len, warmup_budget, cache):
    """Every input checked, cheaply, before any lowering: (engine, bucket variables, requests, context length)."""
    from hpu_backend.planning.serving import buckets as bk
    from hpu_backend.planning.serving import trace as tr
    from hpu_backend.modelfiles.hfmodels import card_bytes, context_length
    from hpu_backend.planning.serving.plan import PlanError, check_engine, check_fits

    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected {' or '.join(TARGETS)}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: expected {' or '.join(DTYPES)}")
    if not 1 <= cards <= 8:
        raise UsageError(f"--cards {cards}: a server joins 1 to 8 cards")
    prefix_caching, blocks_override, release = cache
    for name, value, high in (("--max-model-len", max_model_len, 1 << 24), ("--block-size", block_size, 1 << 16),
                              ("--max-num-seqs", max_num_seqs, 1 << 16),
                              ("--max-num-batched-tokens", max_num_batched_tokens, 1 << 24),
                              ("--num-gpu-blocks-override", blocks_override, 1 << 28)):
        if value is not None and not 1 <= value <= high:
            raise UsageError(f"{name} {value}: expected an integer from 1 to {high:,}")
    if warmup_budget is not None and not 0 < warmup_budget <= 1e7:
        raise UsageError(f"--warmup-budget {warmup_budget:g}: expected seconds above 0, at most 10,000,000")
    if trace is not None and requests is not None:
        raise UsageError("--trace reads a trace, --requests draws one: give one")
    if requests is not None and not 1 <= requests <= tr.MAX_REQUESTS:
        raise UsageError(f"--requests {requests}: expected 1 to {tr.MAX_REQUESTS:,}")
    if warmup_budget is not None and trace is None and requests is None:
        raise UsageError("--warmup-budget recommends settings for a trace: give --trace or --requests")
    _scale_patching(env)  # checked with the rest, before lowering
    engine = bk.Engine(max_model_len=max_model_len, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=gpu_memory_utilization,
                       graph_reserved_mem=_reserved(env), enable_prefix_caching=prefix_caching,
                       num_gpu_blocks_override=blocks_override, release=release)
    config = _config(model)
    context = None if config is None else context_length(config)
    try:
        check_engine(engine, context)
        if config is not None:  # the model's size against the cards, from the config alone
            check_fits(model, target, cards, *card_bytes(config, cards, 1 if dtype == "fp8" else 2), engine)
        variables = {**bk.bucket_env(os.environ), **dict(_pair(e) for e in env or [])}
        bk.validate(variables)
        engine = bk.resolve(engine, variables)
        bk.generate(engine, None, variables)  # the prompt grid, built once here to check it before lowering
        reqs = _requests(trace, requests, rate, prompt_len, output_len)
        if reqs is not None:
            tr.check(reqs, max_model_len, context)
    except (bk.BucketSettingError, tr.TraceError, PlanError) as e:
        raise UsageError(str(e)) from None
    return engine, variables, reqs, context


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not (name.strip().startswith("VLLM_") or name.strip() == "RUNTIME_SCALE_PATCHING"):
        raise UsageError(f"--env {text!r}: expected VLLM_NAME=VALUE or RUNTIME_SCALE_PATCHING=0|1, e.g. "
                         "VLLM_PROMPT_QUERY_BUCKET_MAX=2048")
    return name.strip(), value.strip()


def _scale_patching(env: list[str] | None) -> bool:
    """RUNTIME_SCALE_PATCHING from --env, else the process environment (0 or 1, vLLM-Gaudi's reading)."""
    raw = dict(_pair(e) for e in env or []).get("RUNTIME_SCALE_PATCHING", os.environ.get("RUNTIME_SCALE_PATCHING", "0"))
    if raw.strip() not in ("0", "1"):
        raise UsageError(f"RUNTIME_SCALE_PATCHING={raw!r}: expected 0 or 1")
    return raw.strip() == "1"


def _reserved(env: list[str] | None) -> float:
    raw = dict(_pair(e) for e in env or []).get("VLLM_GRAPH_RESERVED_MEM", os.environ.get("VLLM_GRAPH_RESERVED_MEM"))
    if raw is None:
        return 0.1
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"VLLM_GRAPH_RESERVED_MEM={raw!r}: expected a fraction from 0 to below 1") from None


def _config(model: str):
    """The transformers config of a Hugging Face config.json, read without building the model; None for a model
    file."""
    from hpu_backend.modelfiles.hfmodels import build_config, is_config, read_config

    if not is_config(model):
        return None
    return build_config(read_config(model), model)


def _requests(trace, requests, rate, prompt_len, output_len):
    from hpu_backend.planning.serving import trace as tr

    if trace is not None:
        return tr.read_jsonl(trace)
    if requests is None:
        return None
    return tr.poisson(requests, rate, _range("--prompt-len", prompt_len), _range("--output-len", output_len))


def _range(name: str, text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise UsageError(f"{name} {text!r}: expected LOW:HIGH token counts, e.g. 128:1024") from None
    if not 1 <= low <= high <= 1 << 24:
        raise UsageError(f"{name} {text!r}: expected 1 <= LOW <= HIGH <= {1 << 24:,}")
    return low, high


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
    import json as jsonlib

    from hpu_backend.shipping.cachepolicy import config_to_fill
    from hpu_backend.modelfiles.modelfile import load_model_file
    from hpu_backend.modelfiles.modelspec import time_limit
    from hpu_backend.planning.serving.plan import MAX_PLAN_BYTES, PlanError, planned_points
    from hpu_backend.shipping.warm import warm

    from .warmreport import finish, progress

    if not plan_path.is_file() or plan_path.stat().st_size > MAX_PLAN_BYTES:
        raise UsageError(f"--serving-plan {plan_path}: expected a serving plan's JSON file of at most 64 MiB")
    try:
        doc = jsonlib.loads(plan_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"--serving-plan {plan_path}: not JSON ({str(e).splitlines()[0]})") from None
    prompt, decode = planned_points(doc)
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
