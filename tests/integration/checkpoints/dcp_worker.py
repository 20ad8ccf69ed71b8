"""Run under torchrun (save, restore_on_two) or plain python (restore) by test_sharded.py.

save:           torchrun --nproc-per-node=2 dcp_worker.py save STORE_URI OUT_DIR
restore:        python dcp_worker.py restore STORE_URI OUT_DIR        (then saves step 3 from one process)
restore_on_two: torchrun --nproc-per-node=2 dcp_worker.py restore_on_two STORE_URI OUT_DIR
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


def build_sharded() -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same model, FSDP-sharded over the ranks of the process group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, _ = build()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def assert_same_as(full_model: dict, full_optim: dict, reference_path: str) -> None:
    """Full weights and Adam's first moments equal the reference's, bit for bit."""
    reference = torch.load(reference_path, weights_only=False)
    assert full_model.keys() == reference["model"].keys()
    for name, value in full_model.items():
        assert torch.equal(value, reference["model"][name]), f"parameter {name} differs after restore"
    exp_avg = {k: v["exp_avg"] for k, v in full_optim["state"].items()}
    ref_avg = {k: v["exp_avg"] for k, v in reference["optim"]["state"].items()}
    assert exp_avg.keys() == ref_avg.keys()
    for key in exp_avg:
        assert torch.equal(exp_avg[key], ref_avg[key]), f"optimizer state {key} differs after restore"


def save(store_uri: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = build_sharded()
    train_step(model, optimizer, seed=rank)
    store = open_store(store_uri)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    manifest = save_sharded(store, RUN, 1, {"model": model_sd, "optim": optim_sd}, {"loss": 0.5})
    refuse_a_save_on_one_rank(store, {"model": model_sd, "optim": optim_sd}, rank)
    full_model, full_optim = full_state(model, optimizer)
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
    """Step 1 (2 ranks) into one process; then one more step, saved from this process as step 3."""
    model, optimizer = build()
    train_step(model, optimizer, seed=123)  # creates optimizer state for DCP to load into
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    store = open_store(store_uri)
    restored = restore_latest_sharded(store, RUN, state)
    assert restored is not None, "no sharded checkpoint restored"
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert_same_as(*full_state(model, optimizer), f"{out}/ref.pt")
    print(f"restored step {restored[0].step} written by {restored[0].attributes['world_size']} ranks")

    train_step(model, optimizer, seed=7)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    save_sharded(store, RUN, 3, {"model": model_sd, "optim": optim_sd})
    full_model, full_optim = full_state(model, optimizer)
    torch.save({"model": full_model, "optim": full_optim}, f"{out}/ref_one.pt")


def restore_on_two(store_uri: str, out: str) -> None:
    """Step 3 (one process) into 2 FSDP ranks: each rank loads its own shard of every tensor."""
    dist.init_process_group("gloo")
    model, optimizer = build_sharded()
    train_step(model, optimizer, seed=123 + dist.get_rank())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    restored = restore_latest_sharded(open_store(store_uri), RUN, state)
    assert restored is not None, "no sharded checkpoint restored"
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    # Gathered from both ranks' shards (rank 0 alone gets the full state with cpu_offload), so the check covers both.
    full = full_state(model, optimizer)
    if dist.get_rank() == 0:
        assert_same_as(*full, f"{out}/ref_one.pt")
    written_by = restored[0].attributes["world_size"]
    print(f"rank {dist.get_rank()}: restored step {restored[0].step} written by {written_by} ranks")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"save": save, "restore": restore, "restore_on_two": restore_on_two}[sys.argv[1]](sys.argv[2], sys.argv[3])
