"""Nothing read from a checkpoint store is unpickled: crafted DCP metadata, crafted DCP items and
crafted framework files fail their restore with a CheckpointError, and their payload never runs.

Each payload writes a file when unpickled; the tests check that the file never appears.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.fixtures.crafted import Payload
from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.sharded import DCP_FORMAT, load_sharded, restore_latest_sharded, save_sharded
from training_platform.errors import CheckpointError


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def publish_dcp(store: CheckpointStore, tmp_path: Path, state: dict, metadata: bytes | None = None) -> None:
    """Save `state` with DCP itself and publish its files as step 1 of run r (signed, as a job can)."""
    staging = tmp_path / "dcp"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(staging)))
    if metadata is not None:
        (staging / ".metadata").write_bytes(metadata)
    files = {path.name: path for path in staging.iterdir()}
    store.save_files("r", 1, files, attributes={"format": DCP_FORMAT, "world_size": 1})


def test_crafted_dcp_metadata_is_not_unpickled(store, tmp_path):
    marker = tmp_path / "ran"
    publish_dcp(store, tmp_path, {"w": torch.ones(4)}, metadata=pickle.dumps(Payload(marker)))

    with pytest.raises(CheckpointError, match=r"step 1: .*its \.metadata refers to builtins\.exec, which DCP metadata"):
        restore_latest_sharded(store, "r", {"w": torch.zeros(4)})

    assert not marker.exists()


def test_a_crafted_non_tensor_dcp_item_is_not_unpickled(store, tmp_path):
    marker = tmp_path / "ran"
    publish_dcp(store, tmp_path, {"w": torch.ones(4), "step": Payload(marker)})

    with pytest.raises(CheckpointError, match="holds an object this build does not unpickle"):
        load_sharded(store, store.list("r")[0], {"w": torch.zeros(4), "step": -1})

    assert not marker.exists()


def test_plain_dcp_items_still_restore(store):
    save_sharded(store, "r", 3, {"w": torch.arange(4.0), "step": 3, "rng": b'{"json": 1}', "lr": [0.1, 0.2]})
    target = {"w": torch.zeros(4), "step": -1, "rng": b"", "lr": [0.0, 0.0]}
    restore_latest_sharded(store, "r", target)
    assert torch.equal(target["w"], torch.arange(4.0)) and target["step"] == 3
    assert target["rng"] == b'{"json": 1}' and target["lr"] == [0.1, 0.2]


@pytest.mark.parametrize("fmt", [DCP_FORMAT, "deepspeed"])
def test_reading_the_weights_outside_the_job_unpickles_nothing(store, tmp_path, fmt):
    """Evaluation, registration and the checkpoints asset run in the orchestrator: they read the
    weights the workers consolidated, never the shards."""
    from training_platform.train.strategies.consolidate import full_model_state

    marker = tmp_path / "ran"
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    if fmt == DCP_FORMAT:
        names = [".metadata", "__0_0.distcp"]
    else:
        names = ["checkpoint/mp_rank_00_model_states.pt", "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    files = {}
    for name in names:
        path = crafted / name.replace("/", "_")
        torch.save(Payload(marker), path) if name.endswith(".pt") else path.write_bytes(pickle.dumps(Payload(marker)))
        files[name] = path
    manifest, _ = store.save_files("r", 1, files, attributes={"format": fmt, "world_size": 1})

    with pytest.raises(CheckpointError, match="holds no weights consolidated by its workers"):
        full_model_state(store, manifest)

    assert not marker.exists()
