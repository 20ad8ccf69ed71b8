"""Process-group setup for the worker: one line of rank logic, deterministic seeding."""

from __future__ import annotations

import os
import pickle
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from training_platform.launch.base import THREADS_PER_RANK_ENV


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join the process group torchrun/srun set up (or run as a single process without one)."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    else:
        # Share the node's cores between the local ranks instead of oversubscribing them; a fixed thread count
        # also keeps CPU reductions deterministic. A launcher whose nodes share one machine's cores (the local
        # launcher's namespace nodes) says how many each rank gets.
        shared = os.environ.get(THREADS_PER_RANK_ENV, "")
        torch.set_num_threads(int(shared) if shared.isdigit() else max(1, (os.cpu_count() or 1) // local_world_size))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            store=_attempt_store(rank, world_size),
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=10),
        )
    return DistInfo(rank, world_size, local_rank, local_world_size, device, backend)


def _attempt_store(rank: int, world_size: int) -> dist.Store:
    """The rendezvous store, under a prefix of its own for each torchrun restart.

    Seen with torch 2.13 and gloo: after a rank died and torchrun restarted the group, a new rank
    could read a peer address the failed attempt had published and fail to connect. A prefix per
    attempt (TORCHELASTIC_RESTART_COUNT) keeps each attempt's addresses apart.
    """
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not agent_store,
        timeout=timedelta(minutes=10),
    )
    return dist.PrefixStore(f"training_platform/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new uninitialized tensor with NaN, which guards only
    # against reading memory before writing it (a bug) and cost 1.6-2.9% of a GPT-tiny step on
    # CPU in one process, 0.9-1.3% with two DDP ranks (steps with and without it interleaved).
    # DeepSpeed's buckets of hundreds of millions of elements made a CPU step take seconds with it.
    torch.utils.deterministic.fill_uninitialized_memory = False


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


RNG_STATE_BYTES = 1 << 16
"""Room for one rank's pickled RNG states: 12 KB on CPU, plus a small tensor per visible GPU."""


def all_gather_rng_states(info: DistInfo) -> list[dict]:
    """Every rank's RNG states, in rank order, through one fixed-size collective.

    `all_gather_object` takes two (the sizes, then the bytes); on two busy cores each took a
    rank 2-3 ms, paid at every checkpoint.
    """
    if info.world_size == 1:
        return [rng_state()]
    payload = pickle.dumps(rng_state(), protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > RNG_STATE_BYTES - 8:
        raise RuntimeError(f"RNG states of {len(payload)} bytes do not fit RNG_STATE_BYTES ({RNG_STATE_BYTES})")
    local = torch.zeros(RNG_STATE_BYTES, dtype=torch.uint8)
    local[:8] = torch.frombuffer(bytearray(len(payload).to_bytes(8, "little")), dtype=torch.uint8)
    local[8 : 8 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = torch.empty(info.world_size * RNG_STATE_BYTES, dtype=torch.uint8, device=info.device)
    dist.all_gather_into_tensor(gathered, local.to(info.device))
    states = []
    for rank_bytes in gathered.cpu().numpy().reshape(info.world_size, RNG_STATE_BYTES):
        size = int.from_bytes(rank_bytes[:8].tobytes(), "little")
        states.append(pickle.loads(rank_bytes[8 : 8 + size].tobytes()))
    return states


def max_over_ranks(values: list[float], info: DistInfo) -> list[float]:
    """Element-wise maximum of `values` over all ranks (the same list on every rank)."""
    if info.world_size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


_HELD_UNTIL_EXIT: list[object] = []


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group. The group object itself is kept until the process exits (forked
    workers leave with os._exit, freeing nothing): otherwise the last holder of it, DDP's Reducer
    (the loop's or a user script's), frees it later with the GIL held, and its destructor waits for
    gloo's worker thread, which waits for the GIL to free a finished collective: a deadlock
    (pytorch/pytorch#56297), seen here twice as rank 0 hanging after "finished"."""
    if dist.is_initialized():
        _HELD_UNTIL_EXIT.append(dist.group.WORLD)
        dist.destroy_process_group()
