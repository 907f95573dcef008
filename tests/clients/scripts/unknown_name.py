"""A Gaudi name the simulator does not provide: the import fails, naming it."""

import habana_frameworks.torch.hpex.no_such_kernel  # noqa: F401
