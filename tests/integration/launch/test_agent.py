"""The agent (torchrun with a fork server): its workers start as fresh interpreters would."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


def run_agent(tmp_path: Path, *module_args: str) -> subprocess.CompletedProcess:
    python_path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PROBE_DIR": str(tmp_path), "PYTHONPATH": python_path}
    env.pop("OMP_NUM_THREADS", None)  # torchrun sets it to 1 for several processes per node
    command = [sys.executable, "-m", "training_platform.launch.agent", "--nproc-per-node=2",
               "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-id=probe", "-m", "agent_probe",
               *module_args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_workers_start_like_fresh_interpreters(tmp_path):
    done = run_agent(tmp_path, "--greeting", "hello")
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for seen in ranks:
        assert seen["argv"] == ["--greeting", "hello"] and seen["world_size"] == 2
        # Their own processes start the platform's default way, not through the agent's fork server.
        assert seen["start_method"] == "fork"
        assert seen["threads"] == 1  # OMP_NUM_THREADS=1 from torchrun, though torch loaded before it was set
        assert seen["sigterm_default"] and not seen["cuda_initialized"]
        assert seen["frozen_objects"] > 100_000  # torch's, at least: frozen by the fork server (heap_freeze.py)


def test_a_failing_worker_fails_the_job_with_its_traceback(tmp_path):
    done = run_agent(tmp_path, "--fail")
    assert done.returncode != 0
    assert "ValueError: probe asked to fail" in done.stdout + done.stderr
