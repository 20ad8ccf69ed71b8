"""Run by the agent tests as a worker module: writes what a worker sees, fails, or waits when asked to."""

import gc
import json
import multiprocessing
import os
import signal
import sys
import time

import torch

if sys.argv[1:] == ["--fail"]:
    raise ValueError("probe asked to fail")
if sys.argv[1:] == ["--exit-3"]:
    sys.exit(3)
out = os.path.join(os.environ["PROBE_DIR"], f"rank{os.environ['RANK']}.json")


def _terminated(signum, frame):
    with open(out + ".terminated", "w") as handle:
        handle.write(str(signum))
    sys.exit(43)


if sys.argv[1:] == ["--wait"]:  # until SIGTERM, which it records
    signal.signal(signal.SIGTERM, _terminated)
seen = {
    "argv": sys.argv[1:],
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "has_secret": "PROBE_SECRET" in os.environ,
    "start_method": multiprocessing.get_start_method(),
    "threads": torch.get_num_threads(),
    "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "cuda_initialized": torch.cuda.is_initialized(),
    "world_size": int(os.environ["WORLD_SIZE"]),
    # What it started with, past torch: what its standby loaded, and what that import set in the environment.
    "frameworks": sorted(name for name in ("deepspeed", "lightning", "transformers") if name in sys.modules),
    "nvml_based_cuda_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
    "frozen_objects": gc.get_freeze_count(),  # what its fork server froze: no collection here walks them
}
with open(out + ".tmp", "w") as handle:
    json.dump(seen, handle)
os.replace(out + ".tmp", out)
print(f"probe rank {os.environ['RANK']} on stdout", flush=True)
while sys.argv[1:] == ["--wait"]:
    time.sleep(60)
