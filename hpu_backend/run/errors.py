"""The launcher's one named error: a failure of ours (not the script's), shown as one line."""

from __future__ import annotations
from ..errors import HpuBackendError


class RunError(HpuBackendError):
    """The launcher could not run the script, or a rank failed or hung; ``code`` is the exit code
    (1 a failure, 2 a usage error such as ``--cards 0``)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
