"""The step timeline: host, device engines, copies and syncs as an asynchronous Gaudi runs them (``model.py``),
what a run records for it (``record.py``), Chrome/Perfetto traces of it (``trace.py``), what a change would save
(``whatif.py``) and the perf tool's guidance over a trace (``guidance.py``). Torch-free."""

from .host import HOST, HostCosts
from .model import Cost, Schedule, StepTime, cost_of
from .record import Recorder, launching
from .trace import TraceError

__all__ = ["Cost", "HOST", "HostCosts", "Recorder", "Schedule", "StepTime", "TraceError", "cost_of", "launching"]
