"""A Slurm job that lost a node, against recorded `scontrol`/`sinfo` answers and job logs (Slurm 22.05)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from training_platform.launch.base import JobHandle, JobState, JobStatus, RunRequest
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher
from training_platform.launch.slurm_cluster import SlurmCommands
from training_platform.launch.slurm_nodes import last_attempt_log, nodes_lost_in, unresponsive_nodes
from training_platform.runs.events import RunEvents
from training_platform.runs.remote_files import RunFilesPuller
from training_platform.spec import parse_spec

RUNNING_JOB = (
    "JobId=95 JobName=tp-lost UserId=root(0) GroupId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=0 "
    "BatchFlag=1 ExitCode=0:0 Partition=nodes NodeList=tp-node[0-1] BatchHost=tp-node0 NumNodes=2 "
    "WorkDir=@RUN@ StdErr=@RUN@/slurm-95.out StdOut=@RUN@/slurm-95.out Power="
)
# What slurmctld shows once it has marked the node down and requeued the job: nothing says why.
REQUEUED_JOB = (
    "JobId=95 JobName=tp-lost UserId=root(0) GroupId=root(0) JobState=PENDING Reason=BeginTime Requeue=1 "
    "Restarts=1 BatchFlag=1 ExitCode=0:0 Partition=nodes NodeList= NumNodes=2 "
    "WorkDir=@RUN@ StdErr=@RUN@/slurm-95.out StdOut=@RUN@/slurm-95.out Power="
)
FIRST_ATTEMPT = "tp: job 95 attempt 1 on tp-node[0-1], rendezvous tp-node0 at 10.77.0.1:29595\nstep 10: loss=1.2\n"
LOST_NODE = (
    "srun: error: Node failure on tp-node1\n"
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
    "slurmstepd-tp-node0: error: *** JOB 95 ON tp-node0 CANCELLED AT 2026-11-28T07:32:36 DUE TO NODE FAILURE, "
    "SEE SLURMCTLD LOG FOR DETAILS ***\n"
)
SECOND_ATTEMPT = "tp: job 95 attempt 2 on tp-node[0-1], rendezvous tp-node0 at 10.77.0.1:29595\nresumed from step 100\n"


def _fake(tmp_path: Path, monkeypatch, record: str, sinfo: str = "", sinfo_exit: int = 0) -> Path:
    """scontrol answers RECORD (and logs its calls), sinfo prints SINFO."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    show = f'[ "$1" = show ] && echo "{record}"'
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n{show}\nexit 0\n')
    (bin_dir / "sinfo").write_text(f'#!/bin/sh\necho "sinfo $@" >> "{calls}"\nprintf "{sinfo}"\nexit {sinfo_exit}\n')
    for tool in ("scontrol", "sinfo"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


@pytest.mark.parametrize(
    ("sinfo", "lost"),
    [
        ("tp-node0 mixed\\ntp-node1 mixed\\n", []),
        # A node in two partitions is listed twice; `*`: it missed slurmctld's pings.
        ("tp-node0 mixed\\ntp-node0 mixed\\ntp-node1 mixed*\\ntp-node1 mixed*\\n", ["tp-node1"]),
        ("tp-node0 allocated\\ntp-node1 down*\\n", ["tp-node1"]),
        ("tp-node0 completing*\\ntp-node1 fail\\n", ["tp-node0", "tp-node1"]),
        ("tp-node0 draining\\ntp-node1 allocated\\n", []),  # a draining node still runs its jobs
    ],
)
def test_the_nodes_that_stopped_answering_are_named(tmp_path, monkeypatch, sinfo, lost):
    calls = _fake(tmp_path, monkeypatch, "", sinfo)
    assert unresponsive_nodes(SlurmCommands(), "tp-node[0-1]") == lost
    assert "sinfo -h -N -n tp-node[0-1] -o %N %T" in calls.read_text()


def test_a_busy_slurmctld_or_an_empty_node_list_names_no_node(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, "", "tp-node1 down*\\n", sinfo_exit=1)
    assert unresponsive_nodes(SlurmCommands(), "tp-node[0-1]") == []
    assert unresponsive_nodes(SlurmCommands(), "") == []


def test_only_the_last_attempt_of_the_log_tells_how_it_ended(tmp_path):
    log = tmp_path / "slurm-95.out"
    log.write_text(FIRST_ATTEMPT + LOST_NODE)
    assert nodes_lost_in(last_attempt_log(log)) == ["tp-node1"]
    log.write_text(FIRST_ATTEMPT + LOST_NODE + SECOND_ATTEMPT)  # the next attempt runs: nothing lost in it
    assert nodes_lost_in(last_attempt_log(log)) is None
    assert nodes_lost_in("slurmstepd: *** JOB 9 ON n1 CANCELLED AT 2026 DUE TO NODE FAILURE ***") == []
    assert last_attempt_log(tmp_path / "missing.out") == ""


def test_a_running_job_that_lost_a_node_says_which(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, RUNNING_JOB.replace("@RUN@", str(tmp_path)), "tp-node0 mixed\\ntp-node1 mixed*\\n")
    status = SlurmLauncher(SlurmConfig(check_cluster=False)).status(JobHandle("slurm", "95", "lost"))
    assert status.state is JobState.RUNNING and status.lost_nodes == ("tp-node1",)
    assert status.reason.startswith("node tp-node1 stopped answering") and "newest checkpoint" in status.reason


def test_a_job_requeued_after_a_node_failure_says_so_and_waits_out_the_requeue_hold(tmp_path, monkeypatch):
    """Unlike a clean preemption's: slurmctld still delivers the lost attempt's kill once the node is back."""
    (tmp_path / "slurm-95.out").write_text(FIRST_ATTEMPT + LOST_NODE)
    calls = _fake(tmp_path, monkeypatch, REQUEUED_JOB.replace("@RUN@", str(tmp_path)), "tp-node1 idle\\n")
    launcher = SlurmLauncher(SlurmConfig(check_cluster=False))
    handle = JobHandle("slurm", "95", "lost")

    status = launcher.status(handle)
    assert status.state is JobState.REQUEUED and status.lost_nodes == ("tp-node1",)
    assert status.reason == (
        "requeued after node tp-node1 failed: attempt 2 waits (BeginTime) for Slurm's requeue delay and the nodes, "
        "and resumes from the newest checkpoint"
    )
    assert launcher.release_requeue_hold(handle) is None
    assert "update" not in calls.read_text()


def test_a_requeue_without_a_lost_node_or_a_clean_checkpoint_keeps_the_hold(tmp_path, monkeypatch):
    """An operator's `scontrol requeue` of a job that left no emergency checkpoint: Slurm's delay stands."""
    (tmp_path / "slurm-95.out").write_text(FIRST_ATTEMPT)
    calls = _fake(tmp_path, monkeypatch, REQUEUED_JOB.replace("@RUN@", str(tmp_path)))
    launcher = SlurmLauncher(SlurmConfig(check_cluster=False))
    status = launcher.status(JobHandle("slurm", "95", "lost"))
    assert status.state is JobState.REQUEUED and status.lost_nodes == ()
    assert status.reason.startswith("requeued after preemption")
    assert launcher.release_requeue_hold(JobHandle("slurm", "95", "lost")) is None
    assert "update" not in calls.read_text()


class _Statuses:
    """A launcher whose job goes through the given states, one per poll."""

    keeps_preempted_jobs = True

    def __init__(self, statuses: list[JobStatus]):
        self.statuses, self.polled = statuses, 0

    def status(self, handle):
        self.polled += 1
        return self.statuses[min(self.polled, len(self.statuses)) - 1]

    def wait(self, handle, timeout):
        pass

    def release_requeue_hold(self, handle):
        return None


def test_the_training_asset_reports_a_lost_node_once_and_records_it_for_the_run(tmp_path):
    from resources.launcher import LauncherResource

    lost = ("tp-node1",)
    statuses = [
        JobStatus(JobState.RUNNING),
        JobStatus(JobState.RUNNING, "node tp-node1 stopped answering", lost_nodes=lost),
        JobStatus(JobState.RUNNING, "node tp-node1 stopped answering", lost_nodes=lost),
        JobStatus(JobState.REQUEUED, "requeued after node tp-node1 failed", preemptions=1, restarts=1, lost_nodes=lost),
        JobStatus(JobState.RUNNING, "running attempt 2", preemptions=1, restarts=1),
        JobStatus(JobState.SUCCEEDED, "Slurm COMPLETED", exit_code=0, preemptions=1, restarts=1),
    ]
    warnings: list[str] = []
    log = SimpleNamespace(warning=warnings.append, debug=lambda *_: None, info=lambda *_: None)
    spec = parse_spec({"name": "r", "team": "t", "owner": "o", "backend": "slurm"})
    request = RunRequest(spec=spec, run_id="lost", run_dir=tmp_path)
    launcher = _Statuses(statuses)

    status = LauncherResource()._wait(
        SimpleNamespace(log=log), launcher, JobHandle("slurm", "95", "lost"), SimpleNamespace(poll=lambda: None),
        request, RunEvents(tmp_path), RunFilesPuller(None, "lost", tmp_path, "dagster-run"),
    )

    assert status.state is JobState.SUCCEEDED and launcher.polled == len(statuses)
    assert warnings == ["job 95: node tp-node1 stopped answering"]
    recorded = [e for e in RunEvents(tmp_path).read() if e["kind"] == "node_failure"]
    assert [(e["job_id"], e["nodes"]) for e in recorded] == [("95", ["tp-node1"])]
