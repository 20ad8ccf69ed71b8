"""DCP sharded checkpoints reshard: 2 FSDP ranks under torchrun (gloo) save, 1 process restores, and the
other way round."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER = Path(__file__).with_name("dcp_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


# Local tier only: the shards go through the same Storage calls as every other checkpoint,
# which test_s3.py covers against S3; a second torchrun run would cost ~30 s here.
def test_fsdp_shards_restore_at_another_world_size_both_ways(tmp_path):
    store_uri = str(tmp_path / "store")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    _run([*torchrun, f"--master-port={_free_port()}", str(WORKER), "save", store_uri, str(tmp_path)], tmp_path)
    out = _run([sys.executable, str(WORKER), "restore", store_uri, str(tmp_path)], tmp_path)
    assert "restored step 1 written by 2 ranks" in out
    out = _run(
        [*torchrun, f"--master-port={_free_port()}", str(WORKER), "restore_on_two", store_uri, str(tmp_path)], tmp_path
    )
    assert "rank 0: restored step 3 written by 1 ranks" in out and "rank 1: restored step 3 written by 1 ranks" in out
