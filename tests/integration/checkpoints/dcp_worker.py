"""Run under torchrun (save) or plain python (restore) by test_sharded.py.

save:    torchrun --nproc-per-node=2 dcp_worker.py save STORE_URI OUT_DIR
restore: python dcp_worker.py restore STORE_URI OUT_DIR
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from training_platform.checkpoints import AsyncCheckpointer, open_store
from training_platform.checkpoints.sharded import restore_latest_sharded, save_sharded
from training_platform.errors import CheckpointError

RUN = "dcp-run"


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(4, 16, generator=generator)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def save(store_uri: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, _ = build()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train_step(model, optimizer, seed=rank)
    store = open_store(store_uri)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    manifest = save_sharded(store, RUN, 1, {"model": model_sd, "optim": optim_sd}, {"loss": 0.5})
    refuse_a_save_on_one_rank(store, {"model": model_sd, "optim": optim_sd}, rank)
    full_model, full_optim = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        torch.save({"model": full_model, "optim": full_optim, "world_size": manifest.attributes}, f"{out}/ref.pt")
        # The async writer must also work from a torchrun rank (its own process, no rendezvous).
        checkpointer = AsyncCheckpointer(store)
        checkpointer.save_async("async-under-torchrun", 1, {"model": full_model})
        result = checkpointer.wait()
        checkpointer.close()
        assert result.ok, result.error
    dist.barrier()
    dist.destroy_process_group()


def refuse_a_save_on_one_rank(store, state: dict, rank: int) -> None:
    """A save whose storage fails on rank 1 fails on both ranks (neither waits for the other's part), and no
    checkpoint of it becomes visible."""
    stat = store.storage.stat
    if rank == 1:
        def refuse(key):
            raise OSError(28, "No space left on device")
        store.storage.stat = refuse
    try:
        save_sharded(store, RUN, 2, state)
    except CheckpointError as exc:
        assert "rank 1" in str(exc) and "No space left on device" in str(exc), exc
    else:
        raise AssertionError(f"rank {rank}: a save that failed on rank 1 was reported written")
    finally:
        store.storage.stat = stat
    assert [m.step for m in store.list(RUN)] == [1]


def restore(store_uri: str, out: str) -> None:
    model, optimizer = build()
    train_step(model, optimizer, seed=123)  # creates optimizer state for DCP to load into
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    restored = restore_latest_sharded(open_store(store_uri), RUN, state)
    assert restored is not None, "no sharded checkpoint restored"
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    reference = torch.load(f"{out}/ref.pt", weights_only=False)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference["model"][name]), f"parameter {name} differs after restore"
    exp_avg = {k: v["exp_avg"] for k, v in get_state_dict(model, optimizer)[1]["state"].items()}
    ref_avg = {k: v["exp_avg"] for k, v in reference["optim"]["state"].items()}
    assert exp_avg.keys() == ref_avg.keys()
    for key in exp_avg:
        assert torch.equal(exp_avg[key], ref_avg[key]), f"optimizer state {key} differs after restore"
    print(f"restored step {restored[0].step} written by {restored[0].attributes['world_size']} ranks")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"save": save, "restore": restore}[sys.argv[1]](sys.argv[2], sys.argv[3])
