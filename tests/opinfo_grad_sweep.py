"""Which ops the forward and backward graphs of PyTorch's OpInfo gradient samples hold that the op table lacks.

AOTAutograd traces each differentiable op's first float32 sample with the backend's decompositions (no
Dynamo, no lowering, nothing run on a recipe), and every call in its forward and backward graphs that is
not a host op and has no op-table record is listed with the OpInfo names it came from. An op listed here
would be a CPU fallback (and a strict-mode error). Outside the default suite:

    python tests/opinfo_grad_sweep.py [--shard I --shards N]
"""

from __future__ import annotations

import argparse
import warnings
from collections import defaultdict

import torch
from torch._functorch.aot_autograd import aot_function
from torch.testing._internal.common_methods_invocations import op_db

from hpu_backend.capture.decompositions import hpu_decompositions
from hpu_backend.lowering import optable
from hpu_backend.runtime import ops


def _collector(found: dict, tag: str):
    table = optable.shared_table()

    def compiler(gm, _example_inputs):
        for node in gm.graph.nodes:
            name = ops.op_name(node.target) if node.op == "call_function" else None
            if name and not optable.is_host_op(name) and name != "operator::getitem" and table.lookup(name) is None:
                found[name].add(tag)
        return gm
    return compiler


def _loss_of(op, sample):
    """``fn(*grad_inputs) -> scalar`` over the sample's tensors that require gradients, and those tensors."""
    values = [sample.input, *sample.args]
    grads = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]

    def fn(*tensors):
        it = iter(tensors)
        args = [next(it) if isinstance(v, torch.Tensor) and v.requires_grad else v for v in values]
        out = op(*args, **sample.kwargs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
    return fn, grads


def sweep(ops_to_run) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for op in ops_to_run:
        if not op.supports_autograd:
            continue
        try:
            sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=True)))
        except (StopIteration, RuntimeError, NotImplementedError):
            continue
        fn, grads = _loss_of(op, sample)
        if not grads:
            continue
        traced = aot_function(fn, fw_compiler=_collector(found, f"fw:{op.name}"),
                              bw_compiler=_collector(found, f"bw:{op.name}"), decompositions=hpu_decompositions())
        try:
            traced(*grads).backward()
        except Exception:  # an op AOTAutograd cannot trace on CPU (CUDA-only kernels): nothing to list
            continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for name, where in sorted(sweep(op_db[args.shard::args.shards]).items()):
        print(f"{name:50} {len(where):3}  {', '.join(sorted(where)[:4])}")


if __name__ == "__main__":
    main()
