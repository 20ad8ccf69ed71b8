"""The environment a job gets: an allow-list plus what the operator adds, never the orchestrator's all."""

from training_platform.launch.job_env import EXTRA_ENV, job_environment

ORCHESTRATOR = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "LC_ALL": "C.UTF-8",
    "NCCL_DEBUG": "INFO",
    "TP_HOME": "/data",
    "AWS_SECRET_ACCESS_KEY": "checkpoint-bucket-key",
    "MLFLOW_TRACKING_URI": "http://mlflow:5000",
    "TP_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x",
    "DAGSTER_PG_PASSWORD": "pg",
    "DATABASE_URL": "postgresql://u:p@db/x",
    "SLURM_JOB_ID": "12",  # an orchestrator inside a Slurm job: its own job id must not reach sbatch
    "HF_TOKEN": "hf_x",
    "WANDB_API_KEY": "w",
}


def test_only_what_a_job_needs_is_passed():
    passed = job_environment(ORCHESTRATOR)
    assert set(passed) == {
        "PATH", "HOME", "LC_ALL", "NCCL_DEBUG", "TP_HOME", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_URI"
    }


def test_the_operator_names_what_else_jobs_get():
    passed = job_environment({**ORCHESTRATOR, EXTRA_ENV: "HF_TOKEN, WANDB_*"})
    assert {"HF_TOKEN", "WANDB_API_KEY"} <= set(passed) and "DATABASE_URL" not in passed
