"""The one error lowering raises: it names the pass, the passes before it, the node and source line."""

from __future__ import annotations
from ..errors import HpuBackendError


class LoweringError(HpuBackendError, RuntimeError):
    """A graph that cannot be lowered to a recipe (raised by any pass, wrapped by the pipeline)."""

    def __init__(self, reason: str, *, node=None, pass_name: str = "", passes_before=(), graph: str = ""):
        self.reason = reason
        self.node = node
        self.pass_name = pass_name
        self.passes_before = tuple(passes_before)
        self.graph = graph
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [self.reason]
        if self.pass_name:
            before = ", ".join(self.passes_before) or "none"
            parts.append(f"in pass {self.pass_name!r} of graph {self.graph or '?'} (after: {before})")
        if self.node is not None:
            fmt = getattr(self.node, "format_node", None)
            parts.append(f"at node: {fmt() if fmt else self.node}")
            trace = (getattr(self.node, "meta", {}) or {}).get("stack_trace")
            if trace:
                parts.append("from user code:\n" + trace.rstrip())
        return "\n".join(parts)
