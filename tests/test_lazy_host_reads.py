"""Lazy mode: every path by which the host reads a tensor's bytes sees the values eager mode computes (a pending
graph is run first), and a checkpoint taken without a final mark_step() holds the post-step weights."""

from __future__ import annotations

import copy
import ctypes
import io
import pickle

import numpy as np
import pytest
import torch

from hpu_backend import gaudi


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    storage = t.untyped_storage()  # the storage's raw bytes, read through its address
    raw = ctypes.string_at(storage.data_ptr(), storage.nbytes())
    return torch.frombuffer(bytearray(raw), dtype=t.dtype).reshape(t.shape)


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


READS = {
    "torch.save": _saved,
    "pickle": lambda t: pickle.loads(pickle.dumps(t)),
    "deepcopy": copy.deepcopy,
    "untyped_storage": _storage_bytes,
    "typed storage": lambda t: torch.tensor(t.storage().tolist(), dtype=t.dtype).reshape(t.shape),
    "__array__": lambda t: torch.from_numpy(np.asarray(t).copy()),
    "numpy": lambda t: torch.from_numpy(t.numpy().copy()),
    "data_ptr": lambda t: torch.frombuffer(
        bytearray(ctypes.string_at(t.data_ptr(), t.nbytes)), dtype=t.dtype).reshape(t.shape),
    "__dlpack__": lambda t: torch.from_dlpack(t.__dlpack__()).clone(),
    "numpy.from_dlpack": lambda t: torch.from_numpy(np.from_dlpack(t).copy()),
    "buffer protocol": lambda t: torch.frombuffer(bytearray(memoryview(t.numpy())), dtype=t.dtype).reshape(t.shape),
}


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("read", list(READS), ids=list(READS))
def test_every_host_read_of_a_pending_tensor_sees_the_eager_values(read):
    x = torch.arange(12.0).reshape(3, 4)
    expected = READS[read](torch.sin(x) * 3 + 1)
    with gaudi.lazy():
        pending = torch.sin(x) * 3 + 1  # not run yet: the graph is cut by the read
        got = READS[read](pending)
        gaudi.mark_step()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("read", ["torch.save", "pickle", "untyped_storage"])
def test_a_checkpoint_after_opt_step_without_mark_step_holds_the_post_step_weights(read):
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 3), torch.randn(8, 4)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    reference(x).square().mean().backward()
    ref_opt.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with gaudi.lazy():
        model(x).square().mean().backward()
        gaudi.mark_step()
        opt.step()  # pending: the parameters are written back only when the graph runs
        state = model.state_dict()
        saved = {k: READS[read](v) for k, v in state.items()} if read != "torch.save" else _saved(state)
        gaudi.mark_step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(saved[name], value, msg=name)
