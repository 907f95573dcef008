"""What a serving plan is asked for: ``vllm serve``'s engine arguments, the bucket variables and a request trace,
each checked, cheaply, before the model is lowered; and ``plan_serving``, the plan of a model under them.

The checks, in order: the device and the engine arguments' ranges, the trace options, the bucket variables (the
process environment's ``VLLM_*``, then ``env``), the engine against the config's context length, (a config) the
weights and one sequence's KV cache against the cards, the prompt grid, and the trace against --max-model-len.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ...errors import first_line
from ...targets import target_problem
from . import buckets as bk
from . import trace as tr
from .plan import MAX_PLAN_BYTES, PlanError, check_engine, check_fits, planned_points

DTYPES = ("bf16", "fp8")
MAX_CARDS = 8  # the cards of one server
MAX_TOKENS = 1 << 24
# An integer engine argument's valid range: (option, field, highest).
INT_RANGES = (("--max-model-len", "max_model_len", MAX_TOKENS), ("--block-size", "block_size", 1 << 16),
              ("--max-num-seqs", "max_num_seqs", 1 << 16),
              ("--max-num-batched-tokens", "max_num_batched_tokens", MAX_TOKENS),
              ("--num-gpu-blocks-override", "num_gpu_blocks_override", 1 << 28))


class ServingArgsError(PlanError):
    """An argument out of its range, or arguments that do not go together (one line naming the option)."""


@dataclass(frozen=True)
class ServingArgs:
    """A deployment to plan: the model (a model file or a Hugging Face config.json), where it runs, vLLM's engine
    arguments, bucket variables ``VAR=VALUE`` over the process environment's, and a trace to replay (a JSONL file,
    or ``requests`` drawn as Poisson arrivals at ``rate`` with token counts ``LOW:HIGH``)."""

    model: str
    max_model_len: int
    target: str = "gaudi2"
    cards: int = 1
    dtype: str = "bf16"
    block_size: int = 128
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    vllm_gaudi: str = "main"
    env: tuple[str, ...] = ()
    trace: Path | None = None
    requests: int | None = None
    rate: float = 4.0
    prompt_len: str = "128:1024"
    output_len: str = "64:512"
    warmup_budget: float | None = None


@dataclass(frozen=True)
class Checked:
    """The arguments, checked and resolved: the engine, the bucket variables, the trace, the model's context."""

    engine: bk.Engine
    variables: dict[str, str]
    requests: list[tr.Request] | None
    context: int | None
    scale_patching: bool


def plan_serving(args: ServingArgs, say: Callable[[str], None] | None = None,
                 environ: Mapping[str, str] = os.environ) -> tuple[dict[str, Any], list[tr.Request] | None]:
    """The serving plan (``plan.plan``'s JSON-ready dict, with the model's context length) and the trace it
    replayed. ServingArgsError before any lowering for an argument out of range; ``say`` hears each stage."""
    from ...modelfiles.modelfile import load_model_file
    from . import model as sm
    from .plan import plan

    checked = check(args, environ)
    say = say or (lambda _: None)
    say("lowering the prefill and decode steps")
    served = sm.load(load_model_file(args.model), args.target, args.dtype, args.cards, checked.scale_patching)
    try:
        doc = plan(served, checked.engine, checked.variables, checked.requests, args.warmup_budget, say)
    except (bk.BucketSettingError, tr.TraceError) as e:
        raise ServingArgsError(str(e)) from None
    doc["context_length"] = checked.context
    return doc, checked.requests


def read_plan(path: Path) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The prefill and decode points of a serving plan's JSON file (``warm --serving-plan``): ServingArgsError for
    a file that is not one, PlanError for a plan whose grid is malformed."""
    if not path.is_file() or path.stat().st_size > MAX_PLAN_BYTES:
        raise ServingArgsError(f"--serving-plan {path}: expected a serving plan's JSON file of at most 64 MiB")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ServingArgsError(f"--serving-plan {path}: not JSON ({first_line(e)})") from None
    return planned_points(doc)


def check(args: ServingArgs, environ: Mapping[str, str] = os.environ) -> Checked:
    """Every argument checked, cheaply, before any lowering (ServingArgsError naming the first one wrong)."""
    from ...modelfiles.hfmodels import card_bytes, context_length

    _check_ranges(args)
    pairs = dict(_pair(e) for e in args.env)
    scale_patching = _scale_patching(pairs, environ)
    engine = bk.Engine(max_model_len=args.max_model_len, block_size=args.block_size,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       graph_reserved_mem=_reserved(pairs, environ), enable_prefix_caching=args.enable_prefix_caching,
                       num_gpu_blocks_override=args.num_gpu_blocks_override, release=args.vllm_gaudi)
    config = _config(args.model)
    context = None if config is None else context_length(config)
    try:
        check_engine(engine, context)
        if config is not None:  # the model's size against the cards, from the config alone
            check_fits(args.model, args.target, args.cards,
                       *card_bytes(config, args.cards, 1 if args.dtype == "fp8" else 2), engine)
        variables = {**bk.bucket_env(environ), **pairs}
        bk.validate(variables)
        engine = bk.resolve(engine, variables)
        bk.generate(engine, None, variables)  # the prompt grid, built once here to check it before lowering
        requests = _requests(args)
        if requests is not None:
            tr.check(requests, args.max_model_len, context)
    except (bk.BucketSettingError, tr.TraceError, PlanError) as e:
        raise ServingArgsError(str(e)) from None
    return Checked(engine, variables, requests, context, scale_patching)


def _check_ranges(args: ServingArgs) -> None:
    problem = target_problem(args.target)
    if problem:
        raise ServingArgsError(problem)
    if args.dtype not in DTYPES:
        raise ServingArgsError(f"--dtype {args.dtype!r}: expected {' or '.join(DTYPES)}")
    if not 1 <= args.cards <= MAX_CARDS:
        raise ServingArgsError(f"--cards {args.cards}: a server joins 1 to {MAX_CARDS} cards")
    for option, name, high in INT_RANGES:
        value = getattr(args, name)
        if value is not None and not 1 <= value <= high:
            raise ServingArgsError(f"{option} {value}: expected an integer from 1 to {high:,}")
    budget = args.warmup_budget
    if budget is not None and not 0 < budget <= 1e7:
        raise ServingArgsError(f"--warmup-budget {budget:g}: expected seconds above 0, at most 10,000,000")
    if args.trace is not None and args.requests is not None:
        raise ServingArgsError("--trace reads a trace, --requests draws one: give one")
    if args.requests is not None and not 1 <= args.requests <= tr.MAX_REQUESTS:
        raise ServingArgsError(f"--requests {args.requests}: expected 1 to {tr.MAX_REQUESTS:,}")
    if budget is not None and args.trace is None and args.requests is None:
        raise ServingArgsError("--warmup-budget recommends settings for a trace: give --trace or --requests")


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not (name.strip().startswith("VLLM_") or name.strip() == "RUNTIME_SCALE_PATCHING"):
        raise ServingArgsError(f"--env {text!r}: expected VLLM_NAME=VALUE or RUNTIME_SCALE_PATCHING=0|1, e.g. "
                               "VLLM_PROMPT_QUERY_BUCKET_MAX=2048")
    return name.strip(), value.strip()


def _scale_patching(pairs: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    """RUNTIME_SCALE_PATCHING from ``env``, else the process environment (0 or 1, vLLM-Gaudi's reading)."""
    raw = pairs.get("RUNTIME_SCALE_PATCHING", environ.get("RUNTIME_SCALE_PATCHING", "0"))
    if raw.strip() not in ("0", "1"):
        raise ServingArgsError(f"RUNTIME_SCALE_PATCHING={raw!r}: expected 0 or 1")
    return raw.strip() == "1"


def _reserved(pairs: Mapping[str, str], environ: Mapping[str, str]) -> float:
    raw = pairs.get("VLLM_GRAPH_RESERVED_MEM", environ.get("VLLM_GRAPH_RESERVED_MEM"))
    if raw is None:
        return 0.1
    try:
        return float(raw)
    except ValueError:
        raise ServingArgsError(f"VLLM_GRAPH_RESERVED_MEM={raw!r}: expected a fraction from 0 to below 1") from None


def _config(model: str):
    """The transformers config of a Hugging Face config.json, read without building the model; None for a model
    file."""
    from ...modelfiles.hfmodels import build_config, is_config, read_config

    if not is_config(model):
        return None
    return build_config(read_config(model), model)


def _requests(args: ServingArgs) -> list[tr.Request] | None:
    if args.trace is not None:
        return tr.read_jsonl(args.trace)
    if args.requests is None:
        return None
    return tr.poisson(args.requests, args.rate, _range("--prompt-len", args.prompt_len),
                      _range("--output-len", args.output_len))


def _range(name: str, text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise ServingArgsError(f"{name} {text!r}: expected LOW:HIGH token counts, e.g. 128:1024") from None
    if not 1 <= low <= high <= MAX_TOKENS:
        raise ServingArgsError(f"{name} {text!r}: expected 1 <= LOW <= HIGH <= {MAX_TOKENS:,}")
    return low, high
