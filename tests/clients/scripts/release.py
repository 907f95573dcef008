"""What a client sees of the Gaudi software release: importlib.metadata, `pip list`, and Optimum's own reader
(only where ``habana_frameworks`` imports: Optimum cannot be imported without a release). Prints JSON."""

import importlib.metadata
import json
import subprocess

try:
    metadata = importlib.metadata.version("habana-torch-plugin")
except importlib.metadata.PackageNotFoundError:
    metadata = None
pip = subprocess.run("pip list 2>/dev/null | grep habana-torch-plugin", shell=True, capture_output=True, text=True)
optimum = None
if metadata is not None:
    from optimum.habana.utils import get_habana_frameworks_version

    optimum = str(get_habana_frameworks_version())
print(json.dumps({"metadata": metadata, "pip": pip.stdout.split()[-1] if pip.stdout.split() else None,
                  "optimum": optimum}))
