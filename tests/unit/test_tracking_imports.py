"""The registry step loads mlflow.pytorch without the Lightning callback MLflow imports with it (tracking.py)."""

import subprocess
import sys

LOADS = """
import sys

from training_platform.registry.tracking import mlflow_pytorch

module = mlflow_pytorch()
print(callable(module.log_model), "pytorch_lightning" in sys.modules)
# Lightning's autologging still loads when asked for, in the same process.
from mlflow.pytorch._lightning_autolog import patched_fit  # noqa: E402,F401

print("pytorch_lightning" in sys.modules)
"""


def test_mlflow_pytorch_loads_without_lightning_and_autologging_still_can():
    proc = subprocess.run([sys.executable, "-c", LOADS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "False", "True"]
