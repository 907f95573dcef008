"""What a training step holds in HBM beyond one graph's memory plan: gradients, optimizer state and master weights.

A compiled training step runs a forward and a backward graph, each planned on its own (its inputs, the
parameters among them, its outputs and its intermediates). The whole step also holds, for every trainable
parameter: its gradient (the parameter's dtype, from the backward until the optimizer step), the optimizer's
state (fp32: AdamW and Adam keep two moments, SGD with momentum one, plain SGD none) and, when the parameters
are bf16 or fp16, an fp32 master copy that the optimizer updates (mixed precision). The optimizer is the one
the model file's source names (read, never run); a file that names none is planned with AdamW, the common
case and the largest state, and says so.

The step's peak at a batch is then that state plus the largest of: the forward's plan, the backward's plan
with the parameters (they stay in HBM while it runs; the ones it reads are counted twice, an upper bound
by at most the parameter bytes), and the parameters with their gradients at the optimizer step.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..modelfiles.modelspec import ModelSpec

# fp32 states per parameter, by optimizer name (torch.optim and Gaudi's fused ones).
STATES = {"AdamW": 2, "Adam": 2, "FusedAdamW": 2, "Adagrad": 1, "RMSprop": 1, "SGD": 0, "FusedSGD": 0}
ASSUMED = "AdamW"
MOMENTUM = {"SGD", "FusedSGD", "RMSprop"}  # one more state when the call gives a momentum


@dataclass(frozen=True)
class StepState:
    """Bytes a training step holds besides the graphs' plans, and where the optimizer was read."""

    optimizer: str  # "AdamW", "SGD", ...
    parameters: int
    gradients: int
    optimizer_state: int
    master_weights: int
    assumed: bool = False  # the model file names no optimizer: AdamW is planned

    def held(self) -> int:
        """Held through the whole step, whatever graph runs."""
        return self.optimizer_state + self.master_weights

    def peak(self, graph_peaks: list[tuple[str, int]]) -> int:
        """The step's peak from the (kind, planned peak) of its graphs at one batch."""
        during = [p + (self.parameters if kind == "backward" else 0) for kind, p in graph_peaks]
        return self.held() + max([*during, self.parameters + self.gradients])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_state(spec: ModelSpec) -> StepState:
    """The training state of ``spec``'s model (built on the meta device: no weights are allocated)."""
    import torch

    with torch.device("meta"):
        model = spec.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    low = sum(p.numel() for p in params if p.dtype in (torch.bfloat16, torch.float16))
    name, states = optimizer_of(spec)
    count = sum(p.numel() for p in params)
    return StepState(name or ASSUMED, param_bytes, param_bytes, 4 * states * count, 4 * low, assumed=not name)


def optimizer_of(spec: ModelSpec) -> tuple[str, int]:
    """(name, fp32 states per parameter) of the first optimizer the model file's source constructs; ("", AdamW's)
    when it constructs none."""
    path = Path(spec.path.split(":", 1)[0])
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        tree = ast.Module(body=[], type_ignores=[])
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in STATES:
            return name, STATES[name] + (name in MOMENTUM and _momentum(call))
    return "", STATES[ASSUMED]


def _momentum(call: ast.Call) -> bool:
    value = next((k.value for k in call.keywords if k.arg == "momentum"), None)
    return value is not None and not (isinstance(value, ast.Constant) and not value.value)
