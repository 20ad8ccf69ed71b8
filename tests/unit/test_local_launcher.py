"""The local launcher's plan, its checks and how it reads a finished job (no training started)."""

import os
import subprocess

import pytest

from training_platform.errors import SpecError
from training_platform.launch import JobHandle, JobState, LaunchPlan, RunRequest, standby
from training_platform.launch.local import LocalLauncher
from training_platform.launch.node_group import Node, agent_argv
from training_platform.spec import parse_spec


def _request(tmp_path, **resources):
    spec = parse_spec({"name": "r", "team": "t", "owner": "o", "resources": resources})
    return RunRequest(spec=spec, run_id="r-1", run_dir=tmp_path, env={"TP_HOME": str(tmp_path)})


def test_plan_runs_torchrun_with_one_process_per_slot(tmp_path):
    plan = LocalLauncher(visible_gpus=0).plan(_request(tmp_path, procs_per_node=3))
    assert "--nproc-per-node=3" in plan.command
    assert plan.command[-4:] == ["training_platform.train", str(tmp_path / "spec.json"), "--run-id", "r-1"]
    assert plan.env["TP_HOME"] == str(tmp_path)
    assert "-m training_platform.launch.agent --rdzv-backend=tp-loopback --rdzv-endpoint=127.0.0.1:0" in plan.render()


def test_gpus_on_a_cpu_only_machine_are_refused(tmp_path):
    with pytest.raises(SpecError, match="gpus_per_node.*0 to train on CPU"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, gpus_per_node=2, procs_per_node=2))


def test_a_spec_asking_for_more_gpus_than_the_machine_counts_is_refused(tmp_path):
    import torch

    counted = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(SpecError, match=f"{counted + 1} GPU\\(s\\) requested but this machine has {counted};"):
        LocalLauncher().plan(_request(tmp_path, gpus_per_node=counted + 1, procs_per_node=1))


def test_more_nodes_than_it_knows_are_refused_with_how_to_start_them(tmp_path, monkeypatch):
    monkeypatch.delenv("TP_LOCAL_NODES", raising=False)
    with pytest.raises(SpecError, match="2 nodes requested.*knows 0.*local-nodes.sh up 2"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, nodes=2))
    monkeypatch.setenv("TP_LOCAL_NODES", "tp-node0=10.77.0.1")
    with pytest.raises(SpecError, match="knows 1"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, nodes=2))


@pytest.mark.parametrize("value", ["tp-node0", "tp node0=10.77.0.1", "tp-node0=10.77.0", "$(reboot)=10.77.0.1"])
def test_a_malformed_node_is_named_with_the_fix(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TP_LOCAL_NODES", f"{value},tp-node1=10.77.0.2")
    with pytest.raises(SpecError, match="TP_LOCAL_NODES.*local-nodes.sh env"):
        LocalLauncher(visible_gpus=0).plan(_request(tmp_path, nodes=2))
    LocalLauncher(visible_gpus=0).plan(_request(tmp_path))  # a one-node run does not read it


def test_a_run_of_two_nodes_runs_an_agent_in_each_namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_LOCAL_NODES", "tp-node0=10.77.0.1,tp-node1=10.77.0.2,tp-node2=10.77.0.3")
    plan = LocalLauncher(visible_gpus=0).plan(_request(tmp_path, nodes=2, procs_per_node=1))
    split = plan.command.index("--")
    assert plan.command[1:split] == [
        "-m", "training_platform.launch.node_group", "--node=tp-node0=10.77.0.1", "--node=tp-node1=10.77.0.2"
    ]
    assert plan.resources["nodes"] == 2 and plan.env["GLOO_SOCKET_IFNAME"] == "tp0"
    assert plan.env["TP_THREADS_PER_RANK"] == str(max(1, (os.cpu_count() or 1) // 2)), "the nodes share the cores"
    assert standby.SHARED_ENV not in plan.env and standby.STANDBY_ENV not in plan.env
    agent = plan.command[split + 1 :]
    second = agent_argv(agent, Node("tp-node1", "10.77.0.2"), 2, "10.77.0.1:29400", is_host=False)
    assert second[1:4] == ["netns", "exec", "tp-node1"]
    flags = second[4 : second.index("training_platform.train")]
    assert "--rdzv-backend=tp-nodes" in flags and "--rdzv-endpoint=10.77.0.1:29400" in flags
    assert "--rdzv-conf=is_host=0" in flags and "--local-addr=10.77.0.2" in flags and "--nnodes=2" in flags
    assert flags.index("--local-addr=10.77.0.2") < flags.index("-m", flags.index("training_platform.launch.agent"))


def test_namespace_nodes_share_the_machines_gpus_so_a_multi_node_gpu_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_LOCAL_NODES", "tp-node0=10.77.0.1,tp-node1=10.77.0.2")
    with pytest.raises(SpecError, match="gpus_per_node: 0 for a multi-node run"):
        LocalLauncher(visible_gpus=8).plan(_request(tmp_path, nodes=2, gpus_per_node=1, procs_per_node=1))


@pytest.mark.parametrize(
    ("files", "state"),
    [
        ({}, JobState.FAILED),
        ({"preempted.json": "{}"}, JobState.PREEMPTED),
        # The workers finished and wrote the result; torchrun was signalled on its way out.
        ({"result.json": '{"status": "SUCCEEDED"}'}, JobState.SUCCEEDED),
    ],
)
def test_a_nonzero_exit_is_read_with_the_files_the_worker_left(tmp_path, files, state):
    (tmp_path / "exit_code").write_text("1\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    handle = JobHandle(backend="local", job_id=f"{_dead_pid()}:{tmp_path}", run_id="r-1")
    assert LocalLauncher(visible_gpus=0).status(handle).state == state


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_new_attempt_does_not_inherit_the_last_attempts_result(tmp_path):
    (tmp_path / "result.json").write_text('{"status": "SUCCEEDED"}')
    spec_path = _request(tmp_path).write_spec()
    assert spec_path.is_file() and not (tmp_path / "result.json").exists()


@pytest.mark.timeout(60)
def test_wait_returns_when_the_job_ends_not_when_the_poll_is_due(tmp_path):
    launcher = LocalLauncher(visible_gpus=0)
    plan = LaunchPlan(backend="local", run_id="r-1", command=["true"], env={}, workdir=tmp_path, resources={})
    handle = launcher.submit(plan)
    launcher.wait(handle, 3600)  # a poll due in an hour: the job's end ends the wait
    assert launcher.status(handle).state == JobState.SUCCEEDED


def test_a_tp_servers_runs_and_only_they_look_for_the_shared_standby(tmp_path, monkeypatch):
    monkeypatch.delenv(standby.SHARED_OWNER_ENV, raising=False)
    assert standby.SHARED_ENV not in LocalLauncher(visible_gpus=0).plan(_request(tmp_path)).env
    monkeypatch.setenv(standby.SHARED_OWNER_ENV, "4242")  # what the platform's code server sets, to its pid
    assert LocalLauncher(visible_gpus=0).plan(_request(tmp_path)).env[standby.SHARED_ENV] == "1"


def test_a_spot_run_keeps_a_standby_of_its_own_only_where_no_shared_one_serves_its_requeues(tmp_path, monkeypatch):
    request = _request(tmp_path, spot=True)
    monkeypatch.delenv(standby.SHARED_OWNER_ENV, raising=False)
    assert LocalLauncher(visible_gpus=0).plan(request).env[standby.STANDBY_ENV] == "1"
    monkeypatch.setenv(standby.SHARED_OWNER_ENV, "4242")
    env = LocalLauncher(visible_gpus=0).plan(request).env
    assert standby.STANDBY_ENV not in env and env[standby.SHARED_ENV] == "1"


def test_the_import_environment_leaves_out_what_torch_reads_only_when_called():
    environ = {"TP_HOME": "/h", "OMP_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "MLFLOW_RUN_ID": "r"}
    # Lightning and DeepSpeed set PYTORCH_NVML_BASED_CUDA_CHECK when imported: a run's process has it, its server not.
    assert standby.import_environment(environ) == {"TP_HOME": "/h", "OMP_NUM_THREADS": "1"}
