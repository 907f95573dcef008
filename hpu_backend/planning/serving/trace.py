"""A request trace: read from JSONL (arrival time, prompt tokens, output tokens per line) or drawn as Poisson
arrivals with lengths from given distributions; checked against the engine before any planning (torch-free)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from ...errors import HpuBackendError

MAX_REQUESTS = 1_000_000  # a trace is read whole; past this it is not a trace to plan over here
MAX_LINE = 4096  # bytes of one JSONL line
FIELDS = {"arrival": ("arrival", "arrival_s", "timestamp"), "prompt": ("prompt_tokens", "prompt_len", "input_len"),
          "output": ("output_tokens", "output_len", "max_tokens")}


class TraceError(HpuBackendError, ValueError):
    """A trace that cannot be read, or holds a request the engine cannot serve (one line naming it)."""


@dataclass(frozen=True)
class Request:
    arrival: float  # seconds from the trace's start
    prompt: int  # prompt tokens
    output: int  # tokens to generate


def read_jsonl(path: str | Path) -> list[Request]:
    """Every request of a JSONL trace, in arrival order (TraceError naming the line and field)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file (expected JSONL: one request per line)")
    requests = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if len(raw) > MAX_LINE:
                raise TraceError(f"{path}:{n}: line longer than {MAX_LINE} bytes")
            if raw.strip():
                requests.append(_request(raw, f"{path}:{n}"))
            if len(requests) > MAX_REQUESTS:
                raise TraceError(f"{path}: more than {MAX_REQUESTS:,} requests")
    if not requests:
        raise TraceError(f"{path}: no requests")
    return sorted(requests, key=lambda r: r.arrival)


def _request(raw: bytes, where: str) -> Request:
    try:
        row = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object with arrival, prompt_tokens and output_tokens")
    values = {}
    for key, names in FIELDS.items():
        name = next((n for n in names if n in row), None)
        if name is None:
            raise TraceError(f"{where}: missing {names[0]} (or {', '.join(names[1:])})")
        values[key] = _number(row[name], name, where, key != "arrival")
    return Request(values["arrival"], values["prompt"], values["output"])


def _number(value, name: str, where: str, whole: bool):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (whole and (value != int(value) or value < 1)):
        kind = "a positive integer" if whole else "a time in seconds, 0 or more"
        raise TraceError(f"{where}: {name} {value!r}: expected {kind}")
    return int(value) if whole else float(value)


def poisson(requests: int, rate: float, prompt: tuple[int, int], output: tuple[int, int], seed: int = 0
            ) -> list[Request]:
    """``requests`` arrivals at ``rate`` per second (exponential gaps); prompt and output lengths uniform over
    the given (low, high) ranges."""
    if requests < 1 or not rate > 0:
        raise TraceError(f"a synthetic trace needs at least one request and a rate above 0 (got {requests}, {rate})")
    for name, (lo, hi) in (("prompt", prompt), ("output", output)):
        if not 1 <= lo <= hi:
            raise TraceError(f"--{name}-len {lo}:{hi}: expected 1 <= LOW <= HIGH")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(requests):
        t += rng.expovariate(rate)
        out.append(Request(t, rng.randint(*prompt), rng.randint(*output)))
    return out


def check(requests: list[Request], max_model_len: int, context: int | None) -> None:
    """TraceError for the first request longer than max_model_len or the model's own context length."""
    limit, what = (max_model_len, "--max-model-len")
    if context is not None and context < limit:
        limit, what = context, "the model's context length (config)"
    for i, r in enumerate(requests):
        if r.prompt + r.output > limit:
            raise TraceError(f"request {i + 1}: prompt {r.prompt} + output {r.output} tokens is past {what} "
                             f"{limit}; every request must fit 1..{limit} tokens")


__all__ = ["Request", "TraceError", "check", "poisson", "read_jsonl"]
