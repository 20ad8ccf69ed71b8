"""SlurmLauncher without a cluster: the batch script, the state mapping and the cluster checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from training_platform.errors import LaunchError, SpecError
from training_platform.launch.base import JobHandle, JobState, RunRequest
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher, status_from_record
from training_platform.launch.slurm_cluster import ClusterInfo, gpus_in_gres, parse_records, parse_scontrol_record
from training_platform.spec import parse_spec

# `scontrol show job -o` of a job requeued after preemption, from the local cluster (Slurm 22.05).
REQUEUED_JOB = (
    "JobId=11 JobName=tp-spot1 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1075 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A "
    "Partition=spot AllocNode:Sid=localhost:2649 ReqNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 "
    "TRES=cpu=1,node=1,billing=1,gres/gpu=4 Command=/tmp/runs/my run/job.sbatch WorkDir=/tmp/runs/my run "
    "StdErr=/tmp/runs/my run/slurm-11.out StdOut=/tmp/runs/my run/slurm-11.out Power= TresPerNode=gres:gpu:4"
)
PARTITIONS = (
    "PartitionName=ondemand AllowGroups=ALL Default=YES GraceTime=0 Nodes=vm PriorityTier=10 PreemptMode=OFF "
    "State=UP TotalCPUs=2 TotalNodes=1\n"
    "PartitionName=spot AllowGroups=ALL Default=NO GraceTime=10 Nodes=vm PriorityTier=1 PreemptMode=REQUEUE "
    "State=UP TotalCPUs=2 TotalNodes=1\n"
)
NODES = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:4 NodeAddr=vm "
    "Partitions=ondemand,spot State=IDLE\n"
)


def _request(tmp_path: Path, env: dict[str, str] | None = None, **fields) -> RunRequest:
    spec = parse_spec({"name": "resnet", "team": "vision", "owner": "ada", **fields})
    return RunRequest(spec=spec, run_id="resnet-7", run_dir=tmp_path / "run", env=env or {"TP_HOME": "/data"})


def _script(tmp_path: Path, config: SlurmConfig | None = None, **fields) -> str:
    return SlurmLauncher(config).plan(_request(tmp_path, **fields)).files["job.sbatch"]


def test_cpu_script_header_and_body(tmp_path):
    script = _script(tmp_path, resources={"nodes": 1, "procs_per_node": 2})
    for line in (
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --partition=ondemand",
        "#SBATCH --qos=normal",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@60",
        "#SBATCH --time=01:00:00",
        f"#SBATCH --output={tmp_path}/run/slurm-%j.out",
    ):
        assert line in script.splitlines()
    assert "--gres" not in script
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in script
    assert '--nnodes "$SLURM_NNODES" --nproc-per-node 2 --rdzv-backend tp-nodes' in script
    assert '--rdzv-endpoint "$head_addr:$rdzv_port"' in script
    assert f"-m training_platform.train {tmp_path}/run/spec.json --run-id resnet-7" in script
    assert SlurmConfig().python in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_gpu_spot_script(tmp_path):
    script = _script(
        tmp_path,
        resources={
            "nodes": 2,
            "procs_per_node": 4,
            "gpus_per_node": 4,
            "gpu_type": "H100",
            "spot": True,
            "priority": "low",
        },
        slurm={"account": "vision", "time_limit": "2-00:00:00"},
        checkpoint={"grace_period_seconds": 120},
    )
    lines = script.splitlines()
    assert {
        "#SBATCH --nodes=2",
        "#SBATCH --gres=gpu:h100:4",
        "#SBATCH --partition=spot",
        "#SBATCH --qos=low",
        "#SBATCH --account=vision",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --signal=B:TERM@120",
    } <= set(lines)


def test_partition_and_qos_maps_are_configurable(tmp_path):
    config = SlurmConfig(spot_partition="preemptible", qos_by_priority={}, gres_type_by_gpu={"H100": "hopper"})
    script = _script(tmp_path, config, resources={"gpus_per_node": 2, "gpu_type": "H100", "spot": True})
    assert "#SBATCH --partition=preemptible" in script and "--qos" not in script
    assert "#SBATCH --gres=gpu:hopper:2" in script
    explicit = _script(tmp_path, slurm={"partition": "debug", "qos": "urgent"})
    assert "#SBATCH --partition=debug" in explicit and "#SBATCH --qos=urgent" in explicit


def test_environment_stays_out_of_the_script(tmp_path):
    plan = SlurmLauncher().plan(_request(tmp_path, env={"MLFLOW_TRACKING_TOKEN": "s3cr3t"}))
    assert "s3cr3t" not in plan.files["job.sbatch"] and plan.env["MLFLOW_TRACKING_TOKEN"] == "s3cr3t"


def test_bad_time_limit_is_refused_at_the_spec():
    with pytest.raises(SpecError, match="slurm.time_limit"):
        parse_spec({"name": "a", "team": "b", "owner": "c", "slurm": {"time_limit": "forever"}})


def test_scontrol_record_keeps_values_with_spaces():
    record = parse_scontrol_record(REQUEUED_JOB)
    assert record["StdOut"] == "/tmp/runs/my run/slurm-11.out"
    assert record["AllocNode:Sid"] == "localhost:2649" and record["NodeList"] == ""


@pytest.mark.parametrize(
    ("fields", "state", "preemptions", "restarts", "exit_code"),
    [
        ({"JobState": "PENDING", "Reason": "Resources"}, JobState.PENDING, 0, 0, None),
        ({"JobState": "RUNNING", "Restarts": "0"}, JobState.RUNNING, 0, 0, None),
        ({"JobState": "RUNNING", "Restarts": "2"}, JobState.RUNNING, 2, 2, None),
        ({"JobState": "PREEMPTED", "ExitCode": "0:15"}, JobState.PREEMPTED, 1, 0, 0),
        ({"JobState": "COMPLETED", "ExitCode": "0:0"}, JobState.SUCCEEDED, 0, 0, 0),
        ({"JobState": "FAILED", "ExitCode": "1:0", "Reason": "NonZeroExitCode"}, JobState.FAILED, 0, 0, 1),
        ({"JobState": "FAILED", "ExitCode": "75:0"}, JobState.PREEMPTED, 1, 0, 75),
        ({"JobState": "TIMEOUT", "ExitCode": "0:15"}, JobState.FAILED, 0, 0, 0),
        ({"JobState": "CANCELLED", "ExitCode": "0:15"}, JobState.CANCELLED, 0, 0, 0),
        ({"JobState": "NODE_FAIL"}, JobState.FAILED, 0, 0, None),
        # Transient states Slurm leaves by itself: the caller must keep following the job.
        ({"JobState": "SIGNALING"}, JobState.RUNNING, 0, 0, None),
        ({"JobState": "SUSPENDED"}, JobState.PENDING, 1, 0, None),
        ({"JobState": "SOMETHING_NEW"}, JobState.PENDING, 0, 0, None),
    ],
)
def test_state_mapping(fields, state, preemptions, restarts, exit_code):
    status = status_from_record(fields)
    assert (status.state, status.preemptions, status.restarts, status.exit_code) == (
        state,
        preemptions,
        restarts,
        exit_code,
    )


def test_requeued_after_preemption():
    status = status_from_record(parse_scontrol_record(REQUEUED_JOB))
    assert status.state is JobState.REQUEUED and status.restarts == 1 and status.preemptions == 1
    assert "BeginTime" in status.reason


def test_gres_parsing():
    assert gpus_in_gres("gpu:4", None) == 4
    assert gpus_in_gres("gpu:h100:8(S:0-1),gpu:l4:2", "h100") == 8
    assert gpus_in_gres("gpu:h100:8(S:0-1),gpu:l4:2", None) == 10
    assert gpus_in_gres("gpu:4", "h100") == 0
    assert gpus_in_gres("(null)", None) == 0


def _cluster() -> ClusterInfo:
    return ClusterInfo.from_records(parse_records(PARTITIONS), parse_records(NODES))


def _check(tmp_path, **fields) -> None:
    _cluster().check(SlurmLauncher().plan(_request(tmp_path, **fields)).resources)


def test_cluster_checks_accept_what_fits(tmp_path):
    _check(tmp_path, resources={"procs_per_node": 2, "gpus_per_node": 4, "spot": True})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"slurm": {"partition": "gpu-xl"}},
            r"slurm.partition: Slurm partition 'gpu-xl' does not exist .*ondemand, spot",
        ),
        ({"resources": {"nodes": 3}}, r"resources.nodes: 3 nodes requested but partition 'ondemand' has 1"),
        ({"resources": {"procs_per_node": 8, "gpus_per_node": 8}}, r"resources.gpus_per_node: 8 GPUs per node"),
        ({"resources": {"procs_per_node": 4}}, r"resources.procs_per_node: needs 4 CPUs .* at most 2"),
    ],
)
def test_cluster_checks_refuse_with_the_field_and_fix(tmp_path, fields, message):
    with pytest.raises(SpecError, match=message):
        _check(tmp_path, **fields)


def test_spot_partition_missing_names_resources_spot(tmp_path):
    cluster = ClusterInfo.from_records(parse_records(PARTITIONS.splitlines()[0]), parse_records(NODES))
    with pytest.raises(SpecError, match=r"resources.spot: Slurm partition 'spot' does not exist"):
        cluster.check(SlurmLauncher().plan(_request(tmp_path, resources={"spot": True})).resources)


def _fake_slurm(tmp_path: Path, monkeypatch, sbatch_body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\n{sbatch_body}\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_sbatch_refusal_is_surfaced_verbatim(tmp_path, monkeypatch):
    _fake_slurm(tmp_path, monkeypatch, 'echo "sbatch: error: QOSMaxGRESPerUser" >&2; exit 1')
    launcher = SlurmLauncher(SlurmConfig(check_cluster=False))
    with pytest.raises(
        LaunchError, match=r"(?s)sbatch refused run resnet-7 \(exit 1\):\nsbatch: error: QOSMaxGRESPerUser\n.*sinfo"
    ):
        launcher.submit(launcher.plan(_request(tmp_path)))


def test_submit_writes_spec_and_script_and_returns_the_job_id(tmp_path, monkeypatch):
    _fake_slurm(tmp_path, monkeypatch, 'echo "4242;tp-local"')
    launcher = SlurmLauncher(SlurmConfig(check_cluster=False))
    handle = launcher.submit(launcher.plan(_request(tmp_path)))
    assert handle.job_id == "4242" and handle.backend == "slurm"
    assert (tmp_path / "run" / "spec.json").exists() and (tmp_path / "run" / "job.sbatch").exists()


def test_missing_slurm_clients_are_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    launcher = SlurmLauncher()
    with pytest.raises(LaunchError, match="`scontrol` is not installed.*local-cluster.sh up"):
        launcher.submit(launcher.plan(_request(tmp_path)))


def test_worker_marker_turns_a_failed_exit_into_preempted():
    # torchrun reports 1 whatever its workers exited with; the worker's marker file says why.
    status = status_from_record({"JobState": "FAILED", "ExitCode": "1:0"}, preempted_marker=True)
    assert status.state is JobState.PREEMPTED and "emergency checkpoint" in status.reason


@pytest.mark.parametrize("field", ["partition", "qos", "account"])
def test_an_injected_slurm_directive_is_refused_at_the_spec(field):
    # The reported attack: a newline ends the #SBATCH line, the rest runs as a command and sbatch
    # stops reading directives there (--requeue, --signal, --output are lost).
    with pytest.raises(SpecError, match=rf"^spec: slurm\.{field}: is not allowed") as refused:
        parse_spec({"name": "a", "team": "b", "owner": "c", "slurm": {field: "gpu\ntouch x"}})
    assert len(str(refused.value).splitlines()) == 1


def test_the_script_refuses_a_header_value_that_would_end_its_line(tmp_path):
    # The operator's own settings reach the header too; nothing past a newline may be written.
    config = SlurmConfig(spot_partition="spot\ntouch /tmp/x", qos_by_priority={"normal": "normal"})
    with pytest.raises(SpecError, match=r"#SBATCH --partition: 'spot\\ntouch /tmp/x'"):
        _script(tmp_path, config, resources={"spot": True})
    with pytest.raises(SpecError, match="#SBATCH --chdir"):
        SlurmLauncher().plan(
            RunRequest(spec=_request(tmp_path).spec, run_id="r", run_dir=tmp_path / "my run", env={})
        )


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_requeued_job_is_released_from_the_hold_only_after_a_clean_emergency_checkpoint(
    tmp_path, monkeypatch, checkpointed
):
    workdir = tmp_path / "my run"
    workdir.mkdir()
    if checkpointed:
        (workdir / "preempted.json").write_text('{"step": 40}')
    record = REQUEUED_JOB.replace("/tmp/runs/my run", str(workdir))
    calls = tmp_path / "scontrol-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$@" >> "{calls}"\n[ "$1" = show ] && echo "{record}"\nexit 0\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    launcher = SlurmLauncher(SlurmConfig(check_cluster=False))
    handle = JobHandle("slurm", "11", "resnet-7")

    assert launcher.status(handle).state is JobState.REQUEUED
    assert "update" not in calls.read_text()  # reading the state changes nothing
    done = launcher.release_requeue_hold(handle)
    released = "update JobId=11 StartTime=now" in calls.read_text()
    assert released is checkpointed
    assert (done is not None and "hold released" in done) is checkpointed


def test_a_requeued_job_moves_to_the_on_demand_partition(tmp_path, monkeypatch):
    calls = tmp_path / "scontrol-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexit 0\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = _request(tmp_path, resources={"spot": True}).spec

    done = SlurmLauncher(SlurmConfig(check_cluster=False)).move_to_on_demand(JobHandle("slurm", "11", "r"), spec)

    assert calls.read_text().strip() == "update JobId=11 Partition=ondemand"
    assert done == "Slurm job 11 moved to partition ondemand"


@pytest.mark.parametrize(("state", "forwarded"), [("RUNNING", True), ("SIGNALING", True), ("COMPLETING", False),
                                                   ("CANCELLED", False), ("NODE_FAIL", False)])
def test_the_batch_shell_forwards_a_sigterm_unless_slurm_is_ending_the_job(tmp_path, state, forwarded):
    """The time limit's signal reaches the shell while the job reads RUNNING or SIGNALING: forwarded to the tasks
    (their emergency checkpoint). While Slurm ends the job (scancel, a failed node) it signals the tasks itself, and
    a forward only held the requeue until KillWait ended the shell."""
    script = _script(tmp_path, resources={"nodes": 1, "procs_per_node": 1})
    lines = script.splitlines()
    start = lines.index("on_term() {")
    on_term = "\n".join(lines[start : lines.index("}", start) + 1])
    calls = tmp_path / "scancel-calls"
    probe = "\n".join([
        f'job_field() {{ [[ $1 == JobState ]] && echo {state}; }}',
        f'timeout() {{ shift; echo "$*" >> {calls}; }}',
        "stop_cause=''",
        on_term,
        "on_term",
        'echo "stop_cause=$stop_cause"',
    ])
    shown = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True).stdout
    if forwarded:
        assert calls.read_text() == "scancel --signal=TERM \n"  # SLURM_JOB_ID is not set here
        assert "stopping workers for an emergency checkpoint" in shown
    else:
        assert not calls.exists() and f"tp: SIGTERM as Slurm ends the job ({state})" in shown
        assert "stop_cause=\n" in shown
