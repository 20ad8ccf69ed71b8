"""A stand-in worker for the local launcher's tests: joins a gloo process group (so every store and
socket a run opens is open), records its environment, and waits until the test has looked."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    out = Path(os.environ["TP_PROBE_DIR"])
    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    rank = dist.get_rank()
    (out / f"env-rank{rank}.json").write_text(json.dumps(dict(os.environ)))
    (out / f"ready-rank{rank}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (out / "stop").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
