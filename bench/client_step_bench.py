"""A client's step on the hpu device against the same step on the CPU: a tiny Hugging Face GPT-2 (2 layers, hidden 64,
as a GaudiTrainer fine-tune makes it) trained with AdamW, and ``generate()`` of 16 greedy tokens.

One fresh process per device mode (eager, lazy, compiled with ``backend="hpu_backend"``). Inside it the CPU model
and the device model step in turn (interleaved, so a change in the machine's load hits both), after warm-up steps;
a mode's figure is the median of its steps, and its ratio is device over CPU. Losses and tokens are checked against
the CPU's in every step.

A fourth process, ``floor``, runs the same steps through a wrapper tensor subclass that does nothing but unwrap,
run the op on the host and wrap the result (no device, no bookkeeping): the cost of Python dispatch alone, which
any device written as a Python tensor subclass pays on every op, and a floor for the eager mode's ratio.

    OMP_NUM_THREADS=1 python bench/client_step_bench.py [--steps 8] [--warmup 3]

Each device mode also puts the run report's step time (its estimate of a Gaudi's step) beside the measured wall time
of the same training steps on this host, as the report splits it: the script and torch, the simulator's own work.

Writes bench/results/client_step_bench.json (and .png with matplotlib) and prints one line per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from common import maybe_plot, run_worker

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "client_step_bench.json"
MODES = ("eager", "lazy", "compile", "floor")
NEW_TOKENS = 16


def _model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def _trainer(device: str, compiled: bool, mark_step):
    import torch

    model = _model().to(device)
    forward = torch.compile(model, backend="hpu_backend") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, 128, (4, 32), generator=torch.Generator().manual_seed(1)).to(device)

    def step() -> float:
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        mark_step()
        opt.step()
        opt.zero_grad()
        mark_step()
        return loss.item()  # the step is done when its loss is on the host
    return step


def _generator(device: str, compiled: bool = False):
    import torch

    model = _model().to(device).eval()
    if compiled:  # as a compile-mode user compiles a model for generate(): its forward (generate stays Python)
        model.forward = torch.compile(model.forward, backend="hpu_backend")
    prompt = torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(2)).to(device)

    def step() -> list[int]:
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0)
        return out[0].tolist()
    return step


def _floor_pair():
    """The two steps with the model's tensors in a do-nothing wrapper subclass (``floor`` above)."""
    import torch
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    class Passthrough(torch.Tensor):
        @staticmethod
        def __new__(cls, host, requires_grad=False):
            out = torch.Tensor._make_wrapper_subclass(cls, host.shape, strides=host.stride(), dtype=host.dtype,
                                                      storage_offset=host.storage_offset(),
                                                      requires_grad=requires_grad)
            out.host = host
            return out

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
            if type(out) is torch.Tensor:
                return Passthrough(out)
            if type(out) is tuple or type(out) is list:
                return type(out)(Passthrough(t) if type(t) is torch.Tensor else t for t in out)
            return out

        def tolist(self):
            return self.host.tolist()

    def unwrap(a):
        if type(a) is Passthrough:
            return a.host
        if type(a) is list or type(a) is tuple:
            return type(a)(x.host if type(x) is Passthrough else x for x in a)
        return a

    for kinds in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        kinds.append(Passthrough)  # as the device does: torch's foreach optimizer path
    torch.__future__.set_swap_module_params_on_conversion(True)

    def wrapped(model):
        return model._apply(lambda t: Passthrough(t, t.requires_grad))

    def trainer():
        model = wrapped(_model())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = Passthrough(torch.randint(1, 128, (4, 32), generator=torch.Generator().manual_seed(1)))

        def step() -> float:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.host.item()
        return step

    def generator():
        model = wrapped(_model()).eval()
        prompt = Passthrough(torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(2)))

        def step() -> list[int]:
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                     pad_token_id=0)
            return out.host[0].tolist()
        return step

    return trainer, generator


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def worker(mode: str, steps: int, warmup: int) -> dict:
    if mode == "floor":
        trainer, generator = _floor_pair()
        pairs = {"train_step": (_trainer("cpu", False, lambda: None), trainer()),
                 "generate_16": (_generator("cpu"), generator())}
    else:
        import hpu_backend.device as hd

        hd.enable("eager" if mode == "compile" else mode)
        from hpu_backend import gaudi

        pairs = {"train_step": (_trainer("cpu", False, lambda: None),
                                _trainer("hpu", mode == "compile", gaudi.mark_step)),
                 "generate_16": (_generator("cpu"), _generator("hpu", mode == "compile"))}
    rows, report = {}, None
    for name, (cpu, hpu) in pairs.items():
        cpu_s, hpu_s, same = [], [], True
        for i in range(warmup + steps):
            (tc, want), (th, got) = _timed(cpu), _timed(hpu)
            same = same and (got == want if isinstance(want, list) else abs(got - want) <= 1e-5 * max(1, abs(want)))
            if i >= warmup:
                cpu_s.append(tc)
                hpu_s.append(th)
        c, h = statistics.median(cpu_s), statistics.median(hpu_s)
        rows[name] = {"cpu_s": c, "hpu_s": h, "ratio": h / c, "matches_cpu": same}
        if name == "train_step" and mode != "floor":
            report = _report_against_wall(hd.report()["timeline"])
    return {"mode": mode, "rows": rows, "report": report}


def _report_against_wall(timeline: dict) -> dict:
    """The run report's step time (an estimate of a Gaudi's step) beside the measured wall time of the same steps on
    this host, which the report splits into the script and torch, and the simulator's own work (the two are timed
    in turn, so they add up to the wall time). A report step is a ``mark_step`` interval: two per training step."""
    measured = timeline["measured"]
    wall = measured["wall_s"]
    return {"estimate_step_s": timeline["step_s"], "measured_wall_s": wall,
            "measured_python_s": measured["python_s"], "measured_simulator_s": measured["simulator_s"],
            "estimate_over_wall": timeline["step_s"] / wall}


def run(mode: str, steps: int, warmup: int) -> dict:
    return run_worker(__file__, mode, steps, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--worker", choices=MODES)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup)))
        return
    results = [run(mode, args.steps, args.warmup) for mode in MODES]
    out = {"model": "GPT-2, 2 layers, hidden 64, batch 4 x 32 tokens; generate 16 tokens from 8", "steps": args.steps,
           "warmup": args.warmup, "load_average_1min": os.getloadavg()[0],
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "modes": results}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    maybe_plot("client_step_bench", list(MODES),
               {f"{name} (device / CPU)": [r["rows"][name]["ratio"] for r in results]
                for name in ("train_step", "generate_16")}, "device time / CPU time (median)")
    for r in results:
        line = "; ".join(f"{name} {row['hpu_s'] * 1e3:.1f} ms vs CPU {row['cpu_s'] * 1e3:.1f} ms = {row['ratio']:.2f}x"
                         f"{'' if row['matches_cpu'] else ' (DIFFERS from the CPU)'}"
                         for name, row in r["rows"].items())
        rep = r.get("report")
        if rep:
            line += (f"; report's step {rep['estimate_step_s'] * 1e3:.1f} ms (estimate) vs "
                     f"{rep['measured_wall_s'] * 1e3:.1f} ms measured on this host (script and torch "
                     f"{rep['measured_python_s'] * 1e3:.1f} ms, simulator {rep['measured_simulator_s'] * 1e3:.1f} ms)")
        print(f"{r['mode']}: {line}")


if __name__ == "__main__":
    main()
