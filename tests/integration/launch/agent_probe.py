"""Run by the agent test as a worker module: writes what a worker sees, or fails when asked to."""

import json
import multiprocessing
import os
import signal
import sys

import torch

if sys.argv[1:] == ["--fail"]:
    raise ValueError("probe asked to fail")
out = os.path.join(os.environ["PROBE_DIR"], f"rank{os.environ['RANK']}.json")
with open(out, "w") as handle:
    json.dump(
        {
            "argv": sys.argv[1:],
            "start_method": multiprocessing.get_start_method(),
            "threads": torch.get_num_threads(),
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "cuda_initialized": torch.cuda.is_initialized(),
            "world_size": int(os.environ["WORLD_SIZE"]),
        },
        handle,
    )
