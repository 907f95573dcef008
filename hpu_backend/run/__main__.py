"""``python -m hpu_backend.run SCRIPT [ARGS...]``: see ``launcher.py``."""

import sys

from .launcher import main

sys.exit(main())
