"""The local launcher's plan and its checks (no processes started)."""

import pytest

from training_platform.errors import SpecError
from training_platform.launch import RunRequest
from training_platform.launch.local import LocalLauncher
from training_platform.spec import parse_spec


def _request(tmp_path, **resources):
    spec = parse_spec({"name": "r", "team": "t", "owner": "o", "resources": resources})
    return RunRequest(spec=spec, run_id="r-1", run_dir=tmp_path, env={"TP_HOME": str(tmp_path)})


def test_plan_runs_torchrun_with_one_process_per_slot(tmp_path):
    plan = LocalLauncher(visible_gpus=0).plan(_request(tmp_path, procs_per_node=3))
    assert "--nproc-per-node=3" in plan.command
    assert plan.command[-4:] == ["training_platform.train", str(tmp_path / "spec.json"), "--run-id", "r-1"]
    assert plan.env["TP_HOME"] == str(tmp_path)
    assert "-m training_platform.launch.agent --rdzv-backend=c10d --rdzv-endpoint=localhost:0" in plan.render()


def test_gpus_on_a_cpu_only_machine_are_refused(tmp_path):
    with pytest.raises(SpecError, match="gpus_per_node.*0 to train on CPU"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, gpus_per_node=2, procs_per_node=2))


def test_several_nodes_are_refused(tmp_path):
    with pytest.raises(SpecError, match="resources.nodes.*--launcher slurm"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, nodes=2))
