"""Collectives in recipes: the functional c10d ops a recipe may name, and what a loaded one must satisfy.

Dynamo traces tensor-parallel code (DTensor, ``parallelize_module``) into ``_c10d_functional`` ops: a
collective returns a tensor that ``wait_tensor`` completes. A recipe runs them through ``torch.distributed``
itself (the ops are the executor's callables, as any aten op is). A collective names its process group by
a string: a recipe is data, so that string must name a group registered in the running process (checked
when the recipe is built into a callable), and a reduction must be one of c10d's.
"""

from __future__ import annotations

from typing import Any

import torch
from ..errors import HpuBackendError

NAMESPACE = "_c10d_functional"
# Functional collective op (packet) -> the fabric's collective kind (hpu_backend.targets.COLLECTIVES).
KINDS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
         "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}
OPS = frozenset({*KINDS, "wait_tensor"})
REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max"})
_GROUP_ARG = {"all_reduce": 2, "all_gather_into_tensor": 2, "reduce_scatter_tensor": 3, "all_to_all_single": 3}
_REDUCE_ARG = {"all_reduce": 1, "reduce_scatter_tensor": 1}
_SIZE_ARG = {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 2}


class CollectiveError(HpuBackendError, ValueError):
    """A collective whose group or reduction cannot be used here (one line naming it)."""


def packet(op_name: str) -> str | None:
    """``_c10d_functional::all_reduce.default`` -> ``all_reduce``; None for any other op."""
    namespace, _, rest = op_name.partition("::")
    name = rest.rpartition(".")[0]
    return name if namespace == NAMESPACE and name in OPS else None


def kind(op_name: str) -> str | None:
    """The fabric's kind of a collective op (``all_reduce``, ``all_gather``, ...); None for others (wait too)."""
    return KINDS.get(packet(op_name) or "")


def _arg(node, index: int, name: str) -> Any:
    return node.kwargs.get(name) if name in node.kwargs else (node.args[index] if index < len(node.args) else None)


def group_name(node, op: str | None = None) -> Any:
    """The group-name argument of a collective node (a recipe Node; an FX node with its ``op`` name)."""
    p = packet(op or node.op)
    return _arg(node, _GROUP_ARG[p], "group_name") if p in _GROUP_ARG else None


def stated_size(node, op: str | None = None) -> int | None:
    """The group size a collective states itself (all_gather, reduce_scatter), else None."""
    p = packet(op or node.op)
    return _arg(node, _SIZE_ARG[p], "group_size") if p in _SIZE_ARG else None


def live_group_size(name: Any) -> int | None:
    """The size of the process group registered under ``name`` in this process; None if there is none."""
    if not isinstance(name, str) or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        return _resolve_process_group(name).size()
    except (RuntimeError, ValueError, KeyError):
        return None


def check_structure(node) -> None:
    """CollectiveError unless the node's group is a name and its reduction is c10d's (data checks only)."""
    p = packet(node.op)
    if p is None or p == "wait_tensor":
        return
    name = group_name(node)
    if not isinstance(name, str) or not name or len(name) > 256:
        raise CollectiveError(f"node {node.name}: collective group must be a process group name, got {name!r:.40}")
    if p in _REDUCE_ARG and _arg(node, _REDUCE_ARG[p], "reduce_op") not in REDUCE_OPS:
        raise CollectiveError(f"node {node.name}: reduction {_arg(node, _REDUCE_ARG[p], 'reduce_op')!r:.40} "
                              f"is not one of {', '.join(sorted(REDUCE_OPS))}")


def check_runnable(node) -> None:
    """CollectiveError unless the node's group is a process group of this process (with the size it states)."""
    check_structure(node)
    p = packet(node.op)
    if p is None or p == "wait_tensor":
        return
    name = group_name(node)
    size = live_group_size(name)
    if size is None:
        raise CollectiveError(f"node {node.name}: process group {name!r} is not a group of this process "
                              f"(init_process_group first)")
    stated = stated_size(node)
    if stated is not None and stated != size:
        raise CollectiveError(f"node {node.name}: group {name!r} has {size} ranks, the recipe says {stated!r:.20}")
