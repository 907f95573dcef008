"""An ExportedProgram made recipe-ready: decomposed to the HPU op set, lowered once, its inputs named.

What a recipe package and an HPU graph both start from: torch.export gives one whole-model graph
whose inputs say where their values come from (parameters, buffers, constants, user inputs).
"""

from __future__ import annotations

import warnings

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from .decompositions import hpu_decompositions
from ..lowering import LoweringContext, LoweringError, lower
from ..formats.package import GraphInput, PackageError
from ..formats.recipe import Recipe
from ..settings import Settings

KINDS = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer",
         InputKind.CONSTANT_TENSOR: "constant", InputKind.USER_INPUT: "user"}


def decompose(ep: ExportedProgram, training: bool = False, in_place: bool = False) -> ExportedProgram:
    """The exported program in the HPU op set (the table torch.compile's AOTAutograd uses);
    PackageError if it mutates inputs or buffers (it would not be a pure inference graph). ``training``: the
    module was in train mode, where the usual cause is a layer that updates its statistics (batch norm).
    ``in_place``: the caller writes mutated inputs and buffers back (an HPU graph's KV-cache update), so in
    eval mode they are allowed; a train-mode buffer update is still refused."""
    with warnings.catch_warnings():  # torch's own deepcopy of pytree specs, not something the user can act on
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        ep = ep.run_decompositions(hpu_decompositions())
    kinds = {s.kind for s in ep.graph_signature.output_specs}
    allowed = {OutputKind.USER_OUTPUT}
    if in_place:
        allowed |= {OutputKind.USER_INPUT_MUTATION} | ({OutputKind.BUFFER_MUTATION} if not training else set())
    if kinds - allowed:
        what = sorted(k.name for k in kinds)
        if training:
            raise PackageError(f"the model is in train mode and updates its buffers ({what}, e.g. batch-norm "
                               "running statistics); packages and HPU graphs serve inference: call model.eval()")
        raise PackageError(f"the model mutates its inputs or buffers in eval mode ({what}); "
                           "packages and HPU graphs serve pure inference graphs")
    return ep


def lower_exported(ep: ExportedProgram, settings: Settings, name: str) -> tuple[Recipe, LoweringContext]:
    """Capture and run the graph passes once: the template every bucket is lowered from, and the context
    its buckets' lowerings start from (``ctx.for_bucket``)."""
    ctx = LoweringContext(settings, name=name, kind="inference", gm=ep.graph_module)
    try:
        return lower(ep.graph_module, ctx).template, ctx
    except LoweringError as e:
        raise PackageError(f"{name}: the exported graph cannot be lowered: {e.reason}") from None


def graph_inputs(ep: ExportedProgram) -> list[GraphInput]:
    """The graph's placeholders in order: where each one's value comes from at a call."""
    out, user = [], 0
    for s in ep.graph_signature.input_specs:
        if s.kind not in KINDS or not isinstance(s.arg, TensorArgument) and s.kind != InputKind.USER_INPUT:
            raise PackageError(f"graph input {s.arg} of kind {s.kind.name} is not supported")
        if s.kind == InputKind.USER_INPUT:
            out.append(GraphInput("user", getattr(s.arg, "name", f"arg{user}"), user))
            user += 1
        else:
            out.append(GraphInput(KINDS[s.kind], s.target))
    return out
