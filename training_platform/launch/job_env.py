"""The environment a job starts with: an allow-list, never the orchestrator's whole environment.

The orchestrator's environment holds its webhook URLs, database and cloud credentials; a user's
training script must not see them. A job gets what Python, torch and the worker need (below), the
variables its launch request names (the run's MLflow run, Pipes, TP_HOME), and what the operator
adds with ``TP_JOB_ENV`` (comma-separated names; ``NAME_*`` for a prefix), e.g. ``HF_TOKEN,WANDB_*``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

EXTRA_ENV = "TP_JOB_ENV"
NAMES = frozenset(
    {
        # The process itself.
        *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"),
        *("PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "LD_LIBRARY_PATH"),
        *("HF_HOME", "XDG_CACHE_HOME", "SLURM_CONF"),
        # What the worker reads (training_platform/): its home, caches, prices, sweep context, notices.
        *("TP_HOME", "TP_SHARD_CACHE", "TP_CODE_DIR", "TP_PRICES", "TP_SWEEP_CONTEXT", "TP_SWEEP_STORAGE"),
        *("TP_CHECKPOINT_KEY", "TP_SPOT_NOTICE_HOSTS", "TP_TELEMETRY_INTERVAL_S", "TP_SLOW_DATA_SECONDS"),
        "TP_THREADS_PER_RANK",  # nodes that share one machine's cores (launch/base.py)
        "TP_SNAPSHOT_STORE_URI",  # where the run's snapshot is, when not in the home (paths.py)
        # The deployment's checkpoint signing key: a job signs what it saves and verifies what it restores.
        "TP_CHECKPOINT_SIGNING_KEY",
        # The checkpoint store on S3 (checkpoints/s3.py): give the orchestrator credentials that reach
        # the checkpoint bucket and nothing else, since every job gets them.
        *("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"),
        *("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "TP_S3_ENDPOINT_URL"),
        # Reporting to the run's own MLflow run.
        *("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"),
        *("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH"),
    }
)
# Runtime tuning of torch, its collectives and the math libraries.
PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "NVIDIA_")


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `environ` (default: this process's), to which a launcher adds its request's."""
    environ = os.environ if environ is None else environ
    names, prefixes = set(NAMES), list(PREFIXES)
    for item in filter(None, (part.strip() for part in environ.get(EXTRA_ENV, "").split(","))):
        if item.endswith("*"):
            prefixes.append(item[:-1])
        else:
            names.add(item)
    return {key: value for key, value in environ.items() if key in names or key.startswith(tuple(prefixes))}
