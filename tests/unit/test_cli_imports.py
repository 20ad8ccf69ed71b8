"""`tp` answers while you wait: loading the command line imports neither torch nor dagster (over a second each),
nor Optuna or MLflow, nor pyarrow and numpy (0.3 s of every command).

Commands that need them (`tp gc`, `tp doctor`) import them when they run; the commands that read the
platform server (`tp runs`, `tp status`, `tp metrics`) never do, nor does `tp train`'s check of a CPU spec before it
submits (the launcher counts GPUs, with torch, only for a spec that asks for some).
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "dagster", "dagster_graphql", "mlflow", "deepspeed", "boto3", "optuna", "pyarrow", "numpy")


def test_the_command_line_loads_without_torch_dagster_or_mlflow():
    _assert_light("training_platform.cli.main")


def test_status_and_metrics_read_the_server_without_torch_or_dagster():
    _assert_light("training_platform.cli.main", "training_platform.cli.telemetry", "training_platform.client.records",
                  "training_platform.telemetry.prometheus")


def test_train_checks_a_cpu_spec_before_submitting_without_torch(tmp_path):
    # What `tp train`, `tp sweep` and `tp retrain` run before they reach the server: preflight, own files, the
    # launcher's plan and check.
    _assert_light(
        "training_platform.cli.main",
        then="from pathlib import Path\nfrom training_platform.paths import PlatformHome\n"
        "from training_platform.spec import load_spec\n"
        f"training_platform.cli.main._validated(load_spec({str(ROOT / 'examples' / 'digits.yaml')!r}), "
        f"PlatformHome(Path({str(tmp_path)!r})), 'local')\n",
    )


def _assert_light(*modules: str, then: str = "") -> None:
    probe = (
        f"import sys, {', '.join(modules)}\n{then}"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "", f"`tp` imports {loaded.stdout.strip()} at start"
