"""DeepSpeed's checkpoint files are loaded with weights_only: what ZeRO writes loads, a crafted
file is refused and its payload never runs."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.crafted import Payload
from training_platform.errors import CheckpointError

pytest.importorskip("deepspeed")  # an optional dependency: without it there is nothing to load
from training_platform.train.strategies import deepspeed_files  # noqa: E402


def test_what_zero_writes_loads(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # The shape of a ZeRO-2 optimizer file: plain data plus the three classes DeepSpeed pickles.
    state = {
        "loss_scaler": LossScaler(scale=1),
        "zero_stage": ZeroStageEnum.gradients,
        "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}],
        "single_partition_of_fp32_groups": [torch.arange(4.0)],
        "ds_version": "0.19.8",
    }
    torch.save(state, tmp_path / "optim_states.pt", _use_new_zipfile_serialization=False)  # as DeepSpeed saves

    loaded = deepspeed_files.SafeCheckpointEngine().load(str(tmp_path / "optim_states.pt"))

    assert loaded["loss_scaler"].cur_scale == 1 and loaded["zero_stage"] == ZeroStageEnum.gradients
    assert loaded["param_slice_mappings"][0]["w"] == fragment_address(numel=4, start=0)
    assert torch.equal(loaded["single_partition_of_fp32_groups"][0], torch.arange(4.0))


def test_a_crafted_file_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"module": {}, "rng": Payload(marker)}, tmp_path / "mp_rank_00_model_states.pt")

    with pytest.raises(CheckpointError, match=r"mp_rank_00_model_states.pt holds an object .*it refers to exec\)"):
        deepspeed_files.SafeCheckpointEngine().load(str(tmp_path / "mp_rank_00_model_states.pt"))

    assert not marker.exists()
