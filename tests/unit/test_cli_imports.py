"""`tp` answers while you wait: loading the command line imports neither torch nor dagster (over a second each),
nor Optuna or MLflow.

Commands that need them (`tp gc`, `tp status`) import them when they run.
"""

import subprocess
import sys

HEAVY = ("torch", "dagster", "dagster_graphql", "mlflow", "deepspeed", "boto3", "optuna")


def test_the_command_line_loads_without_torch_dagster_or_mlflow():
    probe = (
        "import sys, training_platform.cli\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "", f"`tp` imports {loaded.stdout.strip()} at start"
