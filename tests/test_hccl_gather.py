"""``all_gather_into_tensor`` over ``hccl`` on device tensors takes an output of any shape holding the ranks'
inputs, as HCCL (and NCCL) do: Accelerate's ``gather`` (GaudiTrainer's evaluation) passes a flat one."""

import json

import pytest

from conftest import run_python


@pytest.mark.parametrize("lazy", ["0", "1"])
def test_gather_into_a_flat_output_on_the_device(tmp_path, lazy):
    out = run_python(f"""
import json, torch, torch.distributed as dist
import hpu_backend.device as hd
hd.enable()
from hpu_backend.gaudi.distributed import register_hccl
register_hccl()
dist.init_process_group("hccl", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
size = torch.tensor([[3, 4]], device="hpu")
flat = torch.empty(2, dtype=size.dtype, device="hpu")
dist.all_gather_into_tensor(flat, size)
stacked = torch.empty(1, 2, dtype=size.dtype, device="hpu")
dist.all_gather_into_tensor(stacked, size)
print(json.dumps([flat.cpu().tolist(), list(flat.shape), stacked.cpu().tolist()]))
dist.destroy_process_group()
""", {"PT_HPU_LAZY_MODE": lazy})
    assert json.loads(out.strip().splitlines()[-1]) == [[3, 4], [2], [[3, 4]]]
