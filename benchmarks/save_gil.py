"""How long a sharded save in a training process's thread keeps the process's other threads from running Python.

FSDP's saves run in a thread of the training process (strategies/background_save.py), so what of a save holds
the GIL holds up the loop's Python (FSDP's hooks, the optimizer's loop over its parameters) for as long. A probe
thread sleeps 1 ms in a loop and sums how late it woke beyond GIL_WAIT (the interpreter's 5 ms switch interval
hands the GIL over at least that often, so later than that means a call that held it throughout: a memcpy
under the GIL, say). Same run, same state, one process, alternated REPEATS times, `save_sharded` into a local
store (DCP's files cut into chunks, hashed, packed, written O_DIRECT):

- the baseline: its copies of bytes (into a chunk's buffer, into O_DIRECT's aligned buffer) made by a
  memoryview's slice assignment, one memcpy holding the GIL, as they were before checkpoints/copying.py;
- ours: as it is, those copies made with the GIL released (copying.copy_bytes).

DCP's own save to files (`torch.distributed.checkpoint.save`) blocks nothing measurable here either
(`detail_dcp_blocked_s`): its bytes go from the tensors to the file in C++.

Prints `gil_blocked_ratio` (ours over the baseline's blocked seconds, medians) and the figures behind it.

    python benchmarks/save_gil.py [--size-gb 0.5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training_platform.checkpoints import dcp_chunks, direct_io, open_store  # noqa: E402
from training_platform.checkpoints.copying import copy_bytes  # noqa: E402
from training_platform.checkpoints.sharded import save_sharded  # noqa: E402

GIL_WAIT = 0.005
TENSOR = (2048, 2048)  # 16 MiB of float32 each


def blocked_seconds(work: Callable[[], None]) -> tuple[float, float]:
    """Seconds a 1 ms sleeper woke more than GIL_WAIT late while WORK ran, and WORK's seconds."""
    done, late = threading.Event(), []

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - started - 0.001)

    thread = threading.Thread(target=probe)
    thread.start()
    started = time.perf_counter()
    try:
        work()
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        thread.join()
    return sum(seconds for seconds in late if seconds > GIL_WAIT), elapsed


def copy_holding_the_gil(destination: memoryview, source) -> None:
    destination[:] = memoryview(source).cast("B")


def with_copies(copy: Callable[[memoryview, object], None], work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        dcp_chunks.copy_bytes = direct_io.copy_bytes = copy
        try:
            work()
        finally:
            dcp_chunks.copy_bytes = direct_io.copy_bytes = copy_bytes

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=0.5, help="state size (default 0.5: a rank's shard)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, no group
    count = max(1, round(args.size_gb * 2**30 / (TENSOR[0] * TENSOR[1] * 4)))
    state = {"model": {f"layer{i}": torch.randn(*TENSOR) for i in range(count)}}
    workdir = Path(tempfile.mkdtemp(prefix="tp-save-gil-"))
    try:
        store = open_store(str(workdir / "store"))
        figures: dict[str, list[tuple[float, float]]] = {"baseline": [], "ours": [], "dcp": []}
        step = 0
        for repeat in range(args.repeats):
            for name, copy in (("baseline", copy_holding_the_gil), ("ours", copy_bytes)):
                step += 1
                for tensor in state["model"].values():  # new bytes in every tensor: nothing deduplicates
                    tensor.add_(1.0)
                save = functools.partial(save_sharded, store, "bench", step, state)
                figures[name].append(blocked_seconds(with_copies(copy, save)))
            files = dcp.FileSystemWriter(workdir / f"dcp{repeat}")
            figures["dcp"].append(blocked_seconds(lambda: dcp.save(state, storage_writer=files)))  # noqa: B023
            shutil.rmtree(workdir / f"dcp{repeat}")
        medians = {name: [statistics.median(f[i] for f in runs) for i in (0, 1)] for name, runs in figures.items()}
        print(f"gil_blocked_ratio: {medians['ours'][0] / max(medians['baseline'][0], 1e-6):.3f}")
        for name, (blocked, elapsed) in medians.items():
            print(f"detail_{name}_blocked_s: {blocked:.3f}")
            print(f"detail_{name}_save_s: {elapsed:.3f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
