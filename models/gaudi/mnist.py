"""A Gaudi "hello world" training script in the style of Intel's MNIST example, with a local dataset.

Written for the simulator's tests and as an example: it runs unchanged on a Gaudi host (``python mnist.py
--hpu``) and here (``hpurecipe run mnist.py --hpu``). Without ``--hpu`` it is the same script on the CPU, the
reference the tests compare losses against. The dataset is random 28x28 "digits" from a fixed generator (no
download, no torchvision), so every run and every device sees the same samples.

    hpurecipe run models/gaudi/mnist.py --hpu                          # eager (the default from software 1.21)
    hpurecipe run models/gaudi/mnist.py --hpu --use-lazy-mode          # lazy mode, mark_step as Intel places it
    hpurecipe run models/gaudi/mnist.py --hpu --autocast                # bf16 autocast on the device
    hpurecipe run models/gaudi/mnist.py --hpu --use-torch-compile       # torch.compile(backend="hpu_backend")
    hpurecipe run --cards 2 models/gaudi/mnist.py --hpu --distributed   # DDP over hccl, 2 ranks
"""

import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """A small convolutional classifier (the hello-world network, narrower so that a test step is quick)."""

    def __init__(self, use_autocast=False, device_type="cpu"):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc1 = nn.Linear(16 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)
        self.use_autocast = use_autocast
        self.device_type = device_type

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.use_autocast):
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.max_pool2d(x, 2)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = self.fc2(x)
        return F.log_softmax(x.float(), dim=1)


SAMPLES = 1024  # the same dataset whatever the batch size, steps and ranks


def local_dataset(samples, seed=1234):
    """Random images and labels from a generator of their own: the same on every device and rank."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 28, 28, generator=g)
    labels = (images.flatten(1) @ torch.randn(28 * 28, 10, generator=g)).argmax(1)  # learnable, not noise
    return torch.utils.data.TensorDataset(images, labels)


def parse_args():
    p = argparse.ArgumentParser(description="Gaudi hello-world MNIST (local data)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=6, help="training steps to run")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hpu", action="store_true", help="run on the hpu device")
    p.add_argument("--use-lazy-mode", "--use_lazy_mode", dest="use_lazy_mode", action="store_true",
                   help="place mark_step calls as lazy mode wants them")
    p.add_argument("--autocast", action="store_true", help="bf16 autocast in the forward")
    p.add_argument("--use-torch-compile", action="store_true", help='torch.compile(model, backend="hpu_backend")')
    p.add_argument("--distributed", action="store_true", help="DistributedDataParallel over the launcher's ranks")
    p.add_argument("--pin-memory", action="store_true", help="a pinned-memory data loader, as Intel's DDP run")
    p.add_argument("--losses", help="write the losses of every step here (JSON)")
    p.add_argument("--save-model", help="save a checkpoint (model, optimizer, step) here at the end")
    p.add_argument("--checkpoint", help="resume from this checkpoint")
    return p.parse_args()


def init_distributed(args):
    """Rank and world size from the launcher's variables; hccl on the device, gloo on the CPU."""
    if not args.distributed:
        return 0, 1
    import torch.distributed as dist

    if args.hpu:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers backend="hccl")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("hccl" if args.hpu else "gloo", rank=rank, world_size=world)
    return rank, world


def train(args, model, optimizer, loader, device, first_step):
    losses = []
    model.train()
    for step, (data, target) in enumerate(loader, start=first_step):
        if step >= args.steps:
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        if args.use_lazy_mode:
            import habana_frameworks.torch.core as htcore

            htcore.mark_step()
        optimizer.step()
        if args.use_lazy_mode:
            htcore.mark_step()
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.6f}")
    return losses


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    if args.hpu:
        if args.use_lazy_mode:  # lazy mode is chosen before the bridge loads (eager is the default from 1.21 on)
            os.environ.setdefault("PT_HPU_LAZY_MODE", "1")
        import habana_frameworks.torch.core as htcore  # noqa: F401  (loads the device)

        device = torch.device("hpu")
    rank, world = init_distributed(args)

    dataset = local_dataset(SAMPLES)
    sampler = None
    if args.distributed:
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                                  shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                         pin_memory=args.pin_memory)

    model = Net(args.autocast, device.type).to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    first_step = 0
    if args.checkpoint:
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_step = state["step"]
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1, broadcast_buffers=False,
                                                          gradient_as_bucket_view=True)
    if args.use_torch_compile:
        model = torch.compile(model, backend="hpu_backend")

    if sampler is not None:
        sampler.set_epoch(0)
    losses = train(args, model, optimizer, _from(loader, first_step), device, first_step)

    if args.save_model and rank == 0:
        plain = model.module if args.distributed else model
        plain = getattr(plain, "_orig_mod", plain)
        torch.save({"model": plain.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps},
                   args.save_model)
    if args.losses:
        path = args.losses if world == 1 else f"{args.losses}.rank{rank}"
        with open(path, "w") as f:
            json.dump({"losses": losses, "rank": rank, "world_size": world, "device": device.type}, f)


def _from(loader, first_step):
    """The loader's batches from ``first_step`` on (a resumed run continues where the checkpoint stopped)."""
    for i, batch in enumerate(loader):
        if i >= first_step:
            yield batch


if __name__ == "__main__":
    main()
