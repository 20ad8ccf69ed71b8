"""A stand-in for training_platform.train: records that it ran, and stops like the worker on SIGTERM.

Launcher tests use it so they exercise the launcher (sbatch, srun, torchrun, signals), not training.
"""

import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    spec, run_id = sys.argv[1], sys.argv[sys.argv.index("--run-id") + 1]
    rank = os.environ.get("RANK", "?")
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
    out = Path(os.environ.get("TP_PROBE_DIR", "."))
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    (out / f"started-rank{rank}-attempt{attempt}").write_text(f"{run_id} {spec} {os.environ.get('TP_PROBE_SECRET')}")
    print(f"probe rank {rank} of {os.environ.get('WORLD_SIZE')} attempt {attempt} started", flush=True)
    deadline = time.monotonic() + float(os.environ.get("TP_PROBE_SECONDS", "0"))
    while time.monotonic() < deadline and not stopped:
        time.sleep(0.1)
    if stopped:
        (out / f"sigterm-rank{rank}-attempt{attempt}").write_text("checkpointed")
        print(f"probe rank {rank} got SIGTERM: emergency checkpoint, exit 75", flush=True)
        return 75
    (out / f"finished-rank{rank}").write_text("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
