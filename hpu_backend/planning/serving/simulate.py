"""Continuous batching over a request trace as vLLM-Gaudi schedules it, into a bucket grid (torch-free).

The scheduler is vLLM's with prefills run apart from decodes: at each step, if requests wait and a sequence slot
and their prompt's KV blocks are free, a prefill batch is formed (first come, first served; at most the grid's
largest prompt batch, at most ``max_num_batched_tokens`` prompt tokens) and run alone; a prompt longer than that
budget runs alone in chunks of the budget, each after the context blocks the chunks before it filled; otherwise
every running sequence decodes one token. A decode that needs a block the cache lacks preempts the newest
sequence (recompute: its blocks freed, its prompt and tokens so far prefilled again later). No prefix is cached.
Every step runs at the bucket vLLM-Gaudi's lookup gives (``Grid.prompt_bucket``, ``Grid.decode_bucket``); a
bucket outside the grid (vLLM-Gaudi's fallback) is compiled on first use (its compile time added to that step)
and listed. Padding waste is counted in prompt tokens (batch × query against the prompts' own) and in decode KV
blocks (the bucket's against the blocks the sequences hold).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .buckets import Engine, Grid
from .trace import Request


@dataclass
class Costs:
    """Seconds per step at a bucket, and the compile a shape outside the grid costs."""

    prefill_s: Callable[[tuple[int, int, int]], float]  # (batch, query, context blocks)
    decode_s: Callable[[tuple[int, int, int]], float]  # (batch, 1, blocks)
    compile_s: Callable[[str, tuple[int, int, int]], float]  # (phase, bucket)


@dataclass
class _Seq:
    req: int
    prompt: int
    output: int
    done: int = 0  # tokens generated
    blocks: int = 0


@dataclass
class Replay:
    """What serving the trace on the grid gave."""

    seconds: float = 0.0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    buckets: dict[tuple, list[int]] = field(default_factory=dict)  # (phase, *bucket) -> [steps, real, padded]
    unwarmed: dict[tuple, dict] = field(default_factory=dict)  # (phase, *bucket) -> first use, compile
    preemptions: int = 0
    steps: int = 0
    shapes: dict[str, dict[tuple[int, int], int]] = field(default_factory=lambda: {"prompt": {}, "decode": {}})

    def summary(self) -> dict:
        waste = {f"{key[0]} {'x'.join(map(str, key[1:]))}": {"steps": s, "real": r, "padded": pad,
                                                             "waste": 1 - r / pad if pad else 0.0}
                 for key, (s, r, pad) in sorted(self.buckets.items())}
        real = sum(v[1] for v in self.buckets.values())
        padded = sum(v[2] for v in self.buckets.values())
        return {"seconds": self.seconds, "requests": len(self.ttft), "output_tokens": self.tokens,
                "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
                "ttft_s": percentiles(self.ttft), "tpot_s": percentiles(self.tpot), "steps": self.steps,
                "preemptions": self.preemptions, "padding_waste": 1 - real / padded if padded else 0.0,
                "buckets": waste,
                "unwarmed": [{"phase": key[0], "shape": list(key[1:]), **v}
                             for key, v in sorted(self.unwarmed.items())]}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]  # noqa: E731
    return {"p50": pick(0.50), "p99": pick(0.99)}


def replay(requests: list[Request], grid: Grid, engine: Engine, cache_blocks: int, costs: Costs) -> Replay:
    """Serve ``requests`` on ``grid`` and report (see the module docstring)."""
    out = Replay()
    state = _State(requests, grid, engine, cache_blocks, costs, out)
    while state.pending():
        state.step()
    out.seconds = state.clock
    return out


class _State:
    def __init__(self, requests, grid: Grid, engine: Engine, cache_blocks: int, costs: Costs, out: Replay):
        self.requests, self.grid, self.engine, self.costs, self.out = requests, grid, engine, costs, out
        self.cache_blocks, self.free, self.used = cache_blocks, cache_blocks, 0
        self.prompt_batch = max((b for b, _, _ in grid.prompt), default=1)
        self.arrivals = deque(range(len(requests)))
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.first: dict[int, float] = {}
        self.clock = 0.0

    def pending(self) -> bool:
        return bool(self.arrivals or self.waiting or self.running)

    def step(self) -> None:
        self._arrive()
        if not self.waiting and not self.running:
            self.clock = self.requests[self.arrivals[0]].arrival  # idle until the next request
            return
        batch = self._admit()
        if batch:
            self._prefill(batch)
        else:
            self._decode()
        self.out.steps += 1

    def _arrive(self) -> None:
        while self.arrivals and self.requests[self.arrivals[0]].arrival <= self.clock:
            i = self.arrivals.popleft()
            r = self.requests[i]
            self.waiting.append(_Seq(i, r.prompt, r.output))

    def _admit(self) -> list[_Seq]:
        batch, tokens = [], 0
        while self.waiting and len(batch) < self.prompt_batch:
            s = self.waiting[0]
            length = s.prompt + s.done
            need = self.engine.blocks_per_seq(length)
            if (len(self.running) + len(batch) >= self.engine.max_num_seqs or need > self.free
                    or (batch and tokens + length > self.engine.batched_tokens)):
                break
            self.waiting.popleft()
            s.blocks, self.free, self.used = need, self.free - need, self.used + need
            batch.append(s)
            tokens += length
        return batch

    def _prefill(self, batch: list[_Seq]) -> None:
        longest = max(s.prompt + s.done for s in batch)
        self._raw("prompt", (len(batch), longest))
        budget, filled = self.engine.batched_tokens, 0
        while filled < longest:  # one step, or the chunks of a prompt longer than the budget
            query = min(longest - filled, budget) if len(batch) == 1 else longest
            shape = self.grid.prompt_bucket(len(batch), query, filled // self.engine.block_size)
            self.clock += self.costs.prefill_s(shape) + self._compile("prompt", shape)
            real = query if len(batch) == 1 else sum(s.prompt + s.done for s in batch)
            self._count("prompt", shape, real, shape[0] * shape[1])
            filled += query
        for s in batch:
            self.first.setdefault(s.req, self.clock)
            if s.done == 0:
                s.done = 1  # the prefill yields the first token
                self.out.tokens += 1
            self._finish_or_run(s)

    def _decode(self) -> None:
        self._grow()
        n, used = len(self.running), self.used
        self._raw("decode", (n, used))
        shape = self.grid.decode_bucket(n, used)
        seconds = self.costs.decode_s(shape) + self._compile("decode", shape)
        self._count("decode", shape, used, shape[2])  # the KV blocks read, real and padded
        self.clock += seconds
        self.out.tokens += n
        running, self.running = self.running, []
        for s in running:  # the hot loop of a replay: kept to attribute reads and one comparison
            s.done += 1
            if s.done >= s.output:
                self._finish(s)
            else:
                self.running.append(s)

    def _grow(self) -> None:
        """Give each sequence whose next token starts a block that block; preempt the newest when the cache is
        full (one token a step: at most one block each)."""
        size = self.engine.block_size
        needy = [s for s in self.running if s.prompt + s.done >= s.blocks * size]
        while len(needy) > self.free and len(self.running) > 1:
            self._preempt(self.running[-1])
            needy = [s for s in self.running if s.prompt + s.done >= s.blocks * size]
        for s in needy:
            s.blocks += 1
        self.free -= len(needy)
        self.used += len(needy)

    def _preempt(self, s: _Seq) -> None:
        self.running.remove(s)
        self.free += s.blocks
        self.used -= s.blocks
        s.blocks = 0
        self.waiting.appendleft(s)
        self.out.preemptions += 1

    def _finish_or_run(self, s: _Seq) -> None:
        if s.done >= s.output:
            self._finish(s)
        else:
            self.running.append(s)

    def _finish(self, s: _Seq) -> None:
        self.free += s.blocks
        self.used -= s.blocks
        r = self.requests[s.req]
        first = self.first[s.req]
        self.out.ttft.append(first - r.arrival)
        if s.output > 1:
            self.out.tpot.append((self.clock - first) / (s.output - 1))

    def _compile(self, phase: str, shape: tuple[int, int, int]) -> float:
        if self.grid.warmed(phase, shape):
            return 0.0
        key = (phase, *shape)
        seen = self.out.unwarmed.get(key)
        if seen is not None:
            seen["steps"] += 1
            return 0.0
        seconds = self.costs.compile_s(phase, shape)
        self.out.unwarmed[key] = {"steps": 1, "first_at_s": self.clock, "compile_s": seconds}
        return seconds

    def _raw(self, phase: str, shape: tuple[int, int]) -> None:
        """The unpadded shape (what a recommended grid is searched over)."""
        seen = self.out.shapes[phase]
        seen[shape] = seen.get(shape, 0) + 1

    def _count(self, phase: str, shape: tuple[int, int, int], real: int, padded: int) -> None:
        row = self.out.buckets.setdefault((phase, *shape), [0, 0, 0])
        row[0] += 1
        row[1] += real
        row[2] += padded


__all__ = ["Costs", "Replay", "percentiles", "replay"]
