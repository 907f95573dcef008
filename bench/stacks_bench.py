"""Gaudi's own stacks, step by step, on the hpu device against the same code on the CPU: Optimum Habana's
GaudiTrainer fine-tuning a tiny GPT-2 (2 layers, hidden 64; lazy, eager and ``torch_compile_backend="hpu_backend"``)
and a DeepSpeed ZeRO-1 step of the same model (DeepSpeed's default bucket sizes, its Adam: FusedAdam on the device;
eager, lazy, and eager with ``engine.compile()``).

Needs the ``[clients]`` extra (optimum-habana, deepspeed). Every run is a fresh process under the launcher
(``python -m hpu_backend.run``, one card), as a user starts the script; the device's run and the CPU's run of a
case alternate for ``--rounds`` rounds (interleaved, so a change of the machine's load hits both). A step's time is
the wall time from one step's start to the next's (GaudiTrainer: its ``on_step_begin`` callback, which includes the
step's logging and loss read; DeepSpeed: forward, ``backward``, ``step`` and ``loss.item()``); a case's figure is
the median over all rounds of the steps after ``--warmup``, its ratio device over CPU. The losses of the device's run
are checked against the CPU's (rtol 1e-4).

The CPU's run is the same script with the CPU as the device: GaudiTrainer with ``use_cpu=True`` (torch's AdamW and
clipping in place of Gaudi's fused ones); for DeepSpeed, whose CPU accelerator does not start here, the same step in
plain torch (AdamW, clipped at DeepSpeed's default 1.0: the math ZeRO-1 does on one rank).

    python bench/stacks_bench.py [--steps 8] [--warmup 3] [--rounds 2]

Writes bench/results/stacks_bench.json and prints one line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "stacks_bench.json"
SITE = ROOT / "tests" / "clients" / "site"  # lets PyPI's CUDA torchvision import next to CPU torch (see there)
CASES = (("gaudi_trainer", "lazy"), ("gaudi_trainer", "eager"), ("gaudi_trainer", "compile"),
         ("deepspeed_zero1", "eager"), ("deepspeed_zero1", "lazy"), ("deepspeed_zero1", "compile"))
BATCH, SEQ, VOCAB = 4, 32, 128


def _model():
    import torch
    import transformers.models.gpt2.modeling_gpt2 as gpt2  # looked up now: Optimum's Gaudi class once adapted

    torch.manual_seed(0)
    return gpt2.GPT2LMHeadModel(gpt2.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _batches(count: int) -> list:
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (SEQ,), generator=g) for _ in range(count)]


def gaudi_trainer(device: str, mode: str, steps: int) -> dict:
    from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments
    from transformers import TrainerCallback

    hpu = device == "hpu"
    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            starts.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            starts.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = GaudiTrainingArguments(
            output_dir=out, use_habana=hpu, use_cpu=not hpu, use_lazy_mode=hpu and mode == "lazy",
            torch_compile=hpu and mode == "compile", torch_compile_backend="hpu_backend" if mode == "compile" and hpu
            else None, per_device_train_batch_size=BATCH, max_steps=steps, logging_steps=1, learning_rate=1e-3,
            report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0)
        model = _model()
        data = [{"input_ids": row, "labels": row} for row in _batches(BATCH * steps)]
        trainer = GaudiTrainer(model=model, args=args, train_dataset=data, callbacks=[Clock()],
                               gaudi_config=GaudiConfig(use_fused_adam=hpu, use_fused_clip_norm=hpu))
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"steps_s": [b - a for a, b in zip(starts, starts[1:])], "losses": losses}


def deepspeed_zero1(device: str, mode: str, steps: int) -> dict:
    """On hpu: DeepSpeed's engine. On cpu: the same step in plain torch (AdamW, clipping at DeepSpeed's 1.0), as
    DeepSpeed's CPU accelerator does not start here (it waits on its oneCCL/MPI set-up)."""
    import torch

    model = _model()
    rows = _batches(BATCH * steps)
    if device == "hpu":
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                  "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01}},
                  "zero_optimization": {"stage": 1}}  # DeepSpeed's default bucket sizes
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        optimizer = type(engine.basic_optimizer).__name__
        if mode == "compile":
            engine.compile()  # the accelerator's compile backend: hpu_backend on the hpu device

        def step(ids):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            return loss
        target = engine.device
    else:
        adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-8)
        optimizer = "AdamW"

        def step(ids):
            loss = model(input_ids=ids, labels=ids).loss
            adamw.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            adamw.step()
            return loss
        target = "cpu"
    times, losses = [], []
    for i in range(steps):
        start = time.perf_counter()
        ids = torch.stack(rows[i * BATCH:(i + 1) * BATCH]).to(target)
        losses.append(step(ids).item())
        times.append(time.perf_counter() - start)
    return {"steps_s": times, "losses": losses, "optimizer": optimizer}


def _run(stack: str, device: str, mode: str, steps: int) -> dict:
    """One run of a case in a fresh process under the launcher: the JSON its worker prints last."""
    env = dict(os.environ, PT_HPU_LAZY_MODE="1" if mode == "lazy" else "0", DS_ACCELERATOR=device,
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(SITE),
                                                                          os.environ.get("PYTHONPATH")])))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # Optimum runs `pip list`
    command = [sys.executable, "-m", "hpu_backend.run", __file__, "--worker", stack, device, mode,
               "--steps", str(steps)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{stack} {device} {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def case(stack: str, mode: str, steps: int, warmup: int, rounds: int) -> dict:
    cpu_s, hpu_s, same = [], [], True
    for _ in range(rounds):
        cpu = _run(stack, "cpu", mode, warmup + steps)
        hpu = _run(stack, "hpu", mode, warmup + steps)
        cpu_s += cpu["steps_s"][warmup:]
        hpu_s += hpu["steps_s"][warmup:]
        same = same and len(cpu["losses"]) == len(hpu["losses"]) and all(
            abs(h - c) <= 1e-4 * abs(c) + (1e-4 if stack == "gaudi_trainer" else 0)  # the Trainer logs 4 decimals
            for h, c in zip(hpu["losses"], cpu["losses"]))
    c, h = statistics.median(cpu_s), statistics.median(hpu_s)
    return {"stack": stack, "mode": mode, "cpu_s": c, "hpu_s": h, "ratio": h / c, "matches_cpu": same,
            "steps_per_run": steps, "rounds": rounds, "optimizer": hpu.get("optimizer")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", nargs=3, metavar=("STACK", "DEVICE", "MODE"))
    args = parser.parse_args()
    if args.worker:
        stack, device, mode = args.worker
        print(json.dumps({"gaudi_trainer": gaudi_trainer, "deepspeed_zero1": deepspeed_zero1}[stack](
            device, mode, args.steps)))
        return
    rows = [case(stack, mode, args.steps, args.warmup, args.rounds) for stack, mode in CASES]
    out = {"model": f"GPT-2, 2 layers, hidden 64, batch {BATCH} x {SEQ} tokens", "steps": args.steps,
           "warmup": args.warmup, "rounds": args.rounds, "load_average_1min": os.getloadavg()[0],
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "date": time.strftime("%Y-%m-%d"),
           "cases": rows}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    for r in rows:
        print(f"{r['stack']} {r['mode']}: {r['hpu_s'] * 1e3:.1f} ms vs CPU {r['cpu_s'] * 1e3:.1f} ms = "
              f"{r['ratio']:.2f}x{'' if r['matches_cpu'] else ' (DIFFERS from the CPU)'}")


if __name__ == "__main__":
    main()
