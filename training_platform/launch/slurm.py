"""SlurmLauncher: one sbatch job per run, one `srun torchrun` task per node.

How SIGTERM reaches the workers, and what happens next:
- preemption (partition priority, PreemptMode=REQUEUE, GraceTime): slurmstepd signals the job
  step, so torchrun forwards SIGTERM to the workers, which write an emergency checkpoint and
  exit. Slurm does not requeue a job that ends inside its grace time (it reads FAILED), so the
  batch script, seeing `PreemptTime` set, requeues the job itself with `scontrol requeue`.
- time limit (`--signal=B:TERM@grace`): only the batch shell is signalled; it forwards SIGTERM
  to the step's tasks through slurmctld (`scancel --signal=TERM`; srun, signalled itself, kills
  them) and, once the workers have checkpointed, records the time limit in the run's event log
  and requeues the job, so a long run continues in a fresh allocation.
- the platform making room for a run that outranks it (slurm_preemption.py): as a time limit,
  through `scancel --batch --signal=TERM`, and recorded as a preemption.
- `scancel`: the job reads COMPLETING, the script does not requeue it.
Measured on Slurm 22.05 (tests/integration/launch/).
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from training_platform.checkpoints.durable import DurableCheckpoint
from training_platform.errors import LaunchError, SpecError
from training_platform.launch.base import (
    AGENT_MODULE,
    PREEMPTED_EXIT_CODE,
    JobHandle,
    JobState,
    JobStatus,
    LaunchPlan,
    RunRequest,
    python_executable,
)
from training_platform.launch.job_env import job_environment
from training_platform.launch.rendezvous import NODES
from training_platform.launch.slurm_cluster import ClusterInfo, SlurmCommands, parse_records, parse_scontrol_record
from training_platform.launch.slurm_nodes import last_attempt_log, nodes_lost_in, unresponsive_nodes
from training_platform.launch.slurm_preemption import Need, RunningJob, choose_victims, running_jobs
from training_platform.runs.events import TIME_LIMIT, RunEvents
from training_platform.runs.layout import EVENTS_FILE, PREEMPTED_MARKER
from training_platform.spec import TrainSpec

log = logging.getLogger(__name__)
# Beyond the victims' grace time: for their batch scripts to requeue them and Slurm to free their nodes.
PREEMPTION_MARGIN_S = 30
# Slurm sends the time limit's signal up to a minute before --signal asks (its event resolution).
TIME_LIMIT_SLACK_S = 90
# The batch script's forward of a SIGTERM to the tasks gives up after this: scancel retries a job in transition
# ("Job can not be altered now") every 5-8 s, and the trap must not hold the shell in those retries.
FORWARD_TERM_TIMEOUT_S = 10
ROOM_POLL_S = 0.5


class SlurmConfig(BaseModel):
    """How specs map onto this Slurm cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spot_partition: str = Field("spot", description="partition for resources.spot=true (preemptable)")
    ondemand_partition: str = Field("ondemand", description="partition for resources.spot=false")
    qos_by_priority: dict[str, str] = Field(
        default_factory=lambda: {"low": "low", "normal": "normal", "high": "high"},
        description="QoS per resources.priority; a priority missing here submits without --qos",
    )
    gres_type_by_gpu: dict[str, str] = Field(
        default_factory=dict,
        description="Slurm GRES type per resources.gpu_type (e.g. H100 -> h100); default: lowercase name",
    )
    cpus_per_proc: int = Field(1, ge=1, description="CPUs reserved per worker process")
    python: str = Field(default_factory=python_executable, description="python that runs torchrun on nodes")
    worker_module: str = Field("training_platform.train", description="module torchrun starts on each rank")
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the client commands; default: theirs")
    check_cluster: bool = Field(True, description="check partition, nodes and GPUs with scontrol before sbatch")
    checkpoint_aware_preemption: bool = Field(
        True,
        description="before a job that does not fit, preempt the platform's spot runs that lose least "
        "(launch/slurm_preemption.py); false: Slurm picks (the oldest first)",
    )
    command_timeout_s: float = Field(30.0, gt=0, description="timeout of each Slurm client command")

    def partition_for(self, spec: TrainSpec) -> str:
        return spec.slurm.partition or (self.spot_partition if spec.resources.spot else self.ondemand_partition)

    def qos_for(self, spec: TrainSpec) -> str | None:
        return spec.slurm.qos or self.qos_by_priority.get(spec.resources.priority)


class SlurmLauncher:
    """Plans, submits and watches sbatch jobs."""

    name = "slurm"

    def __init__(self, config: SlurmConfig | None = None) -> None:
        self.config = config or SlurmConfig()
        self.commands = SlurmCommands(self.config.slurm_conf, self.config.command_timeout_s)
        self._logs: dict[str, Path] = {}

    # -- deciding what to run ------------------------------------------------------------------

    def plan(self, request: RunRequest) -> LaunchPlan:
        spec = request.spec
        res = spec.resources
        spot_field = "slurm.partition" if spec.slurm.partition else "resources.spot"
        partition = self.config.partition_for(spec)
        qos = self.config.qos_for(spec)
        gres_type = None
        if res.gpu_type:
            gres_type = self.config.gres_type_by_gpu.get(res.gpu_type, res.gpu_type.lower())
        resources: dict[str, object] = {
            "nodes": res.nodes,
            "procs_per_node": res.procs_per_node,
            "cpus_per_node": res.procs_per_node * self.config.cpus_per_proc,
            "gpus_per_node": res.gpus_per_node,
            "gres_type": gres_type,
            "partition": partition,
            "partition_field": spot_field,
            "qos": qos,
            "time_limit": spec.slurm.time_limit,
            "grace_period_seconds": spec.checkpoint.grace_period_seconds,
        }
        script = render_sbatch(request, resources, self.config, account=spec.slurm.account)
        script_path = request.run_dir / "job.sbatch"
        return LaunchPlan(
            backend=self.name,
            run_id=request.run_id,
            command=["sbatch", "--parsable", str(script_path)],
            env=dict(request.env),
            workdir=request.run_dir,
            resources=resources,
            files={"spec.json": request.spec.model_dump_json(indent=2), "job.sbatch": script},
        )

    # -- running it ----------------------------------------------------------------------------

    def check(self, plan: LaunchPlan) -> None:
        """Refuse (SpecError) a plan this cluster cannot run: unknown partition, too many nodes/GPUs/CPUs."""
        ClusterInfo.query(self.commands).check(plan.resources)

    def submit(self, plan: LaunchPlan) -> JobHandle:
        # Read once: the check and the choice of whom to preempt both look at partitions and nodes.
        cluster = ClusterInfo.query(self.commands) if self.config.check_cluster else None
        if cluster is not None:
            cluster.check(plan.resources)
        plan.workdir.mkdir(parents=True, exist_ok=True)
        for name, text in plan.files.items():
            (plan.workdir / name).write_text(text)
        # The environment travels with sbatch (--export=ALL exports what sbatch was given), not in the
        # script, so no secret the caller passes in RunRequest.env is ever written to disk; sbatch is
        # given the allow-listed environment, not the orchestrator's (launch/job_env.py).
        env = {**job_environment(), **plan.env}
        victims, hold_s = self._victims(plan, cluster) if self.config.checkpoint_aware_preemption else ([], 0)
        command = plan.command
        if victims:  # held back until its room is free; the hold runs out by itself if this process dies
            command = [*plan.command[:-1], f"--begin=now+{hold_s}", plan.command[-1]]
        result = self.commands.run(command, env=env, check=False, inherit=False)
        if result.returncode != 0:
            raise LaunchError(
                f"sbatch refused run {plan.run_id} (exit {result.returncode}):\n{result.stderr.strip()}\n"
                f"check the script {plan.workdir / 'job.sbatch'} against `sinfo` (partitions, GPUs, "
                "time limits) and that slurmctld answers (`scontrol ping`)"
            )
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch answered {result.stdout.strip()!r}, not a job id; see its stderr above")
        self._logs[job_id] = plan.workdir / f"slurm-{job_id}.out"
        handle = JobHandle(backend=self.name, job_id=job_id, run_id=plan.run_id)
        if victims:
            self._make_room(handle, victims, hold_s)
        return handle

    # -- checkpoint-aware preemption (slurm_preemption.py) -------------------------------------

    def _victims(self, plan: LaunchPlan, cluster: ClusterInfo | None) -> tuple[list[RunningJob], int]:
        """The platform's runs to preempt so that `plan` starts, losing least, and how long to hold `plan` back
        for them (their partition's grace time and a margin to requeue); none when it fits, when Slurm does not
        preempt by partition tier here, or when the cluster cannot be read (Slurm decides then)."""
        res = plan.resources
        need = Need(
            partition=str(res["partition"]),
            nodes=int(res["nodes"]),  # type: ignore[call-overload]
            cpus_per_node=int(res["cpus_per_node"]),  # type: ignore[call-overload]
            gpus_per_node=int(res["gpus_per_node"]),  # type: ignore[call-overload]
            gres_type=res.get("gres_type"),  # type: ignore[arg-type]
        )
        config = self.commands.run(["scontrol", "show", "config"], check=False)
        if not re.search(r"^PreemptType\s*=\s*preempt/partition_prio\s*$", config.stdout, re.MULTILINE):
            return [], 0
        try:
            cluster = cluster or ClusterInfo.query(self.commands)
        except LaunchError:
            return [], 0
        if not cluster.preemptable_by(need.partition):
            return [], 0  # a spot run, or a partition that preempts nobody: nothing to choose
        jobs = self.commands.run(["scontrol", "show", "job", "-o"], check=False)
        if jobs.returncode != 0:
            return [], 0
        victims = choose_victims(need, cluster, running_jobs(parse_records(jobs.stdout), self._hostnames), time.time())
        grace = max((cluster.partitions[v.partition].grace_time_s for v in victims), default=0)
        return victims, grace + PREEMPTION_MARGIN_S

    def _make_room(self, handle: JobHandle, victims: list[RunningJob], hold_s: int) -> None:
        """Signal the victims as a time limit would (each batch script forwards SIGTERM to its workers, which
        checkpoint, and requeues itself), then start `handle` as soon as they have left."""
        for victim in victims:
            lost = victim.lost_seconds(time.time())
            log.info(
                "Slurm job %s (run %s) needs room: preempting job %s, which loses %.0f s of work",
                handle.job_id,
                handle.run_id,
                victim.job_id,
                lost,
            )
            self.commands.run(["scancel", "--batch", "--signal=TERM", victim.job_id], check=False)
        ids = ",".join(v.job_id for v in victims)
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            left = self.commands.run(
                ["squeue", "-h", "-j", ids, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%i"], check=False
            )
            if left.returncode == 0 and not left.stdout.strip():
                self.commands.run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=False)
                return
            time.sleep(ROOM_POLL_S)
        log.warning(
            "Slurm job %s: jobs %s still run after %d s; it starts as Slurm schedules it", handle.job_id, ids, hold_s
        )

    def _hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist == "(null)":
            return []
        if "[" not in nodelist and "," not in nodelist:
            return [nodelist]
        return self.commands.run(["scontrol", "show", "hostnames", nodelist], check=False).stdout.split()

    def status(self, handle: JobHandle) -> JobStatus:
        result = self.commands.run(["scontrol", "show", "job", "-o", handle.job_id], check=False)
        if result.returncode == 0 and result.stdout.strip():
            record = parse_scontrol_record(result.stdout.strip().splitlines()[0])
            # torchrun turns the worker's exit code 75 into 1; the worker's marker file tells.
            workdir = Path(record.get("WorkDir") or "/nonexistent")
            preempted = (workdir / PREEMPTED_MARKER).is_file()
            status = self._with_lost_nodes(status_from_record(record, preempted_marker=preempted), record, preempted)
            if status.state is JobState.REQUEUED and RunEvents(workdir).last_kind() == TIME_LIMIT:
                why = (
                    f"requeued at its time limit (slurm.time_limit) after an emergency checkpoint: attempt "
                    f"{status.restarts + 1} waits ({record.get('Reason', 'None')}) and resumes from it"
                )
                status = replace(status, reason=why)
            return status
        return self._status_from_accounting(handle, result.stderr.strip())

    def _with_lost_nodes(self, status: JobStatus, record: dict[str, str], preempted: bool) -> JobStatus:
        """A running job with a node that stopped answering, or a job requeued because a node failed, says so.
        `preempted`: the last attempt checkpointed on a preemption (a clean requeue, not a lost node)."""
        if status.state is JobState.RUNNING:
            lost = unresponsive_nodes(self.commands, record.get("NodeList", ""))
            if lost:
                why = (
                    f"node {', '.join(lost)} stopped answering: the job's ranks there are lost. Slurm requeues the "
                    "job once it marks the node down (SlurmdTimeout), and the run resumes from its newest checkpoint"
                )
                return replace(status, reason=why, lost_nodes=tuple(lost))
        elif status.state is JobState.REQUEUED and not preempted and record.get("StdOut"):
            lost = nodes_lost_in(last_attempt_log(Path(record["StdOut"])))
            if lost is not None:
                named = f"node {', '.join(lost)}" if lost else "a node"
                why = (
                    f"requeued after {named} failed: attempt {status.restarts + 1} waits "
                    f"({record.get('Reason', 'None')}) for Slurm's requeue delay and the nodes, and resumes from "
                    "the newest checkpoint"
                )
                return replace(status, reason=why, lost_nodes=tuple(lost))
        return status

    def release_requeue_hold(self, handle: JobHandle) -> str | None:
        """Slurm holds a requeued job back about two minutes (Reason=BeginTime); a run whose last attempt
        wrote its emergency checkpoint loses nothing by starting at once. Followers ask on every poll of a
        requeued job: slurmctld sets the hold only once the requeue completes, overwriting an earlier update."""
        result = self.commands.run(["scontrol", "show", "job", "-o", handle.job_id], check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return None
        record = parse_scontrol_record(result.stdout.strip().splitlines()[0])
        if not held_after_clean_preemption(record, Path(record.get("WorkDir") or "/nonexistent") / PREEMPTED_MARKER):
            return None  # a job that lost a node waits: slurm_nodes.py
        update = self.commands.run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=False)
        if update.returncode != 0:
            return None
        return f"Slurm job {handle.job_id}: its last attempt checkpointed cleanly, requeue hold released"

    def _status_from_accounting(self, handle: JobHandle, scontrol_error: str) -> JobStatus:
        # slurmctld forgets finished jobs after MinJobAge; only accounting (sacct) remembers them.
        config = self.commands.run(["scontrol", "show", "config"], check=False).stdout
        if "accounting_storage/none" in config or "AccountingStorageType" not in config:
            raise LaunchError(
                f"Slurm job {handle.job_id} is no longer known to slurmctld ({scontrol_error}) and accounting "
                "(sacct) is not configured; raise MinJobAge in slurm.conf or enable slurmdbd"
            )
        out = self.commands.run(
            ["sacct", "-j", handle.job_id, "-X", "-n", "-P", "-o", "State,ExitCode,Restarts"], check=False
        )
        fields = out.stdout.strip().splitlines()[0].split("|") if out.stdout.strip() else []
        if len(fields) < 2:
            raise LaunchError(f"Slurm job {handle.job_id} is unknown to scontrol and sacct: {out.stderr.strip()}")
        record = {"JobState": fields[0].split()[0], "ExitCode": fields[1], "Reason": "None"}
        if len(fields) > 2:
            record["Restarts"] = fields[2]
        return status_from_record(record)

    def cancel(self, handle: JobHandle) -> None:
        self.commands.run(["scancel", handle.job_id])

    def publish_checkpoint(self, handle: JobHandle, checkpoint: DurableCheckpoint) -> None:
        """The job's comment names its last durable checkpoint: what `squeue -o %k` and operators read."""
        command = ["scontrol", "update", f"JobId={handle.job_id}", f"Comment={checkpoint.slurm_comment()}"]
        result = self.commands.run(command, check=False)
        if result.returncode != 0:
            raise LaunchError(f"could not set the comment of Slurm job {handle.job_id}: {result.stderr.strip()}")

    def move_to_on_demand(self, handle: JobHandle, spec: TrainSpec) -> str | None:
        """A requeued job waits in the queue: its next attempt runs in the on-demand partition."""
        on_demand = spec.model_copy(update={"resources": spec.resources.model_copy(update={"spot": False})})
        partition = self.config.ondemand_partition if spec.slurm.partition else self.config.partition_for(on_demand)
        command = ["scontrol", "update", f"JobId={handle.job_id}", f"Partition={partition}"]
        result = self.commands.run(command, check=False)
        if result.returncode != 0:
            raise LaunchError(
                f"could not move Slurm job {handle.job_id} to partition {partition!r}: {result.stderr.strip()}; "
                "check that the partition exists and the job is still pending"
            )
        return f"Slurm job {handle.job_id} moved to partition {partition}"

    def wait(self, handle: JobHandle, timeout: float) -> None:
        time.sleep(timeout)  # Slurm tells a job's end only when asked

    def logs(self, handle: JobHandle) -> str:
        path = self._logs.get(handle.job_id)
        result = self.commands.run(["scontrol", "show", "job", "-o", handle.job_id], check=False)
        if result.returncode == 0 and result.stdout.strip():
            stdout = parse_scontrol_record(result.stdout.strip()).get("StdOut")
            path = Path(stdout) if stdout else path
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")


def render_sbatch(
    request: RunRequest, resources: dict[str, object], config: SlurmConfig, account: str | None = None
) -> str:
    """The batch script: #SBATCH header from the resources, srun torchrun, requeue after preemption."""
    run_dir = request.run_dir
    gpus = int(resources["gpus_per_node"])  # type: ignore[call-overload]
    header = [
        f"--job-name=tp-{request.run_id}",
        f"--nodes={resources['nodes']}",
        # One task per node: torchrun spawns the node's worker processes itself.
        "--ntasks-per-node=1",
        f"--cpus-per-task={resources['cpus_per_node']}",
        f"--partition={resources['partition']}",
        f"--time={resources['time_limit']}",
        "--requeue",
        # B: signals the batch shell only; the script forwards it to the job step.
        f"--signal=B:TERM@{resources['grace_period_seconds']}",
        f"--chdir={run_dir}",
        f"--output={run_dir}/slurm-%j.out",
        # Requeued runs append to the same log instead of truncating the first attempt's.
        "--open-mode=append",
        "--export=ALL",
    ]
    if gpus:
        kind = f"{resources['gres_type']}:" if resources.get("gres_type") else ""
        header.append(f"--gres=gpu:{kind}{gpus}")
    if resources.get("qos"):
        header.append(f"--qos={resources['qos']}")
    if account:
        header.append(f"--account={account}")
    for line in header:
        _check_header(line)
    torchrun = [
        config.python,
        "-m",
        AGENT_MODULE,
        "--nnodes",
        '"$SLURM_NNODES"',
        "--nproc-per-node",
        str(resources["procs_per_node"]),
        "--rdzv-backend",
        NODES,
        "--rdzv-endpoint",
        '"$head_addr:$rdzv_port"',
        "--rdzv-id",
        '"$SLURM_JOB_ID"',
        "-m",
        config.worker_module,
        *[shlex.quote(a) for a in request.worker_args()[1:]],
    ]
    lines = ["#!/bin/bash", *(f"#SBATCH {h}" for h in header), ""]
    time_limit_window = int(resources["grace_period_seconds"]) + TIME_LIMIT_SLACK_S  # type: ignore[call-overload]
    lines += [
        f"# Generated by training_platform for run {request.run_id}.",
        "set -uo pipefail",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "# The rendezvous is served on the first node's address alone (rendezvous.py): where slurmctld reaches it.",
        'head_addr=$(scontrol show node "$head_node" | grep -o "NodeAddr=[^ ]*" | head -n1 | cut -d= -f2)',
        'head_addr=${head_addr:-$head_node}',
        "# A port free on that address now, below the ephemeral range (ports.py), chosen anew by each attempt: jobs",
        "# share nodes (a spot job in its grace time and the job preempting it), and a port derived from the job id",
        "# was once taken by another server there (Address already in use).",
        f'rdzv_port=$({shlex.quote(config.python)} -m training_platform.launch.ports "$head_addr") || exit 1',
        'if [[ $head_addr == *:* ]]; then head_addr="[$head_addr]"; fi',
        'echo "tp: job $SLURM_JOB_ID attempt $((${SLURM_RESTART_COUNT:-0} + 1)) on $SLURM_JOB_NODELIST,'
        ' rendezvous $head_node at $head_addr:$rdzv_port"',
        f"rm -f {PREEMPTED_MARKER}  # left by an earlier attempt; this one writes its own",
        'job_field() { scontrol show job "$SLURM_JOB_ID" | grep -o "$1=[^ ]*" | head -n1 | cut -d= -f2; }',
        "# Before the time limit Slurm signals only this shell (--signal=B:TERM@grace), and so does the",
        "# platform making room for an on-demand run (scancel --batch): forward it to the step's tasks so",
        "# each worker writes an emergency checkpoint. Through slurmctld, not to srun: srun answers SIGTERM",
        "# by killing the step (SIGKILL), and no checkpoint is written. A SIGTERM this close to the job's",
        "# end is its time limit's (Slurm sends it up to a minute early); earlier, it is a preemption.",
        'stop_cause=""',
        "# A SIGTERM while the job is COMPLETING or CANCELLED is Slurm ending it (scancel, a failed node): Slurm",
        "# signals the tasks itself, and a forward would only wait on the job's transition (holding its requeue).",
        "# The time limit's signal comes while the job reads RUNNING or SIGNALING.",
        "on_term() {",
        '    term_state=$(job_field JobState)',
        '    case $term_state in COMPLETING | CANCELLED | NODE_FAIL)',
        '        echo "tp: SIGTERM as Slurm ends the job ($term_state)"; return ;;',
        "    esac",
        '    end_s=$(date -d "$(job_field EndTime)" +%s 2>/dev/null) || end_s=""',
        f"    if [[ -n $end_s ]] && (( end_s - $(date +%s) <= {time_limit_window} )); then stop_cause={TIME_LIMIT};",
        "    else stop_cause=preempted; fi",
        '    echo "tp: SIGTERM ($stop_cause), stopping workers for an emergency checkpoint"',
        f'    timeout {FORWARD_TERM_TIMEOUT_S} scancel --signal=TERM "$SLURM_JOB_ID"',
        "}",
        "trap on_term TERM",
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 " + " ".join(torchrun) + " &",
        "step=$!",
        "# wait returns early when the trap runs: wait until the step itself has exited.",
        'while true; do wait "$step"; rc=$?; kill -0 "$step" 2>/dev/null || break; done',
        "# On preemption Slurm signals the step, not this shell, and a job that ends inside its grace",
        "# time is not requeued; PreemptTime tells that it was preempted. Requeue it ourselves: the",
        "# workers have checkpointed, the resources free up at once, and the next attempt resumes.",
        "# A cancelled job (scancel also sends TERM; its state reads COMPLETING) must stay cancelled.",
        "job_state=$(job_field JobState); preempt_time=$(job_field PreemptTime)",
        "if [[ $job_state == RUNNING ]] &&"
        ' [[ -n $stop_cause || ( -n "$preempt_time" && "$preempt_time" != None ) ]]; then',
        f"    if [[ $stop_cause == {TIME_LIMIT} ]]; then  # the run's event log: not a preemption (runs/events.py)",
        f'        printf \'{{"kind": "{TIME_LIMIT}", "at": %s, "job_id": "%s"}}\\n\''
        f' "$(date +%s.%N)" "$SLURM_JOB_ID" >> {shlex.quote(str(run_dir / EVENTS_FILE))}',
        "    fi",
        '    echo "tp: workers stopped (exit $rc); requeueing job $SLURM_JOB_ID to resume from the checkpoint"',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        f"    exit {PREEMPTED_EXIT_CODE}",
        "fi",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def _check_header(option: str) -> None:
    """sbatch reads directives up to the first line that is not one: whitespace in a value would end the
    line early (or start a command) and hide every directive after it (--requeue, --signal, --output)."""
    if any(c.isspace() or not c.isprintable() for c in option) or "#" in option:
        name, _, value = option.partition("=")
        raise SpecError(
            f"#SBATCH {name}: {value!r} holds whitespace, '#' or a control character; use a plain name "
            "(for a run directory: a TP_HOME path without spaces)"
        )


# scontrol JobState -> our state. Pending and running need the restart count to tell a first
# attempt from a requeued one; see status_from_record. States Slurm comes back from by itself
# (SIGNALING in a preemption's grace time, SUSPENDED) are not PREEMPTED: callers stop following
# a PREEMPTED job and resubmit it, while Slurm is about to requeue or resume this one.
_STATES = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.RUNNING,
    "POWER_UP_NODE": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.PENDING,
    "STOPPED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "PREEMPTED": JobState.PREEMPTED,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
}


def held_after_clean_preemption(record: dict[str, str], marker: Path) -> bool:
    """A requeued job waiting out Slurm's requeue delay, whose last attempt left its emergency-checkpoint
    marker (the batch script removes it when an attempt starts, so it is the previous attempt's)."""
    return (
        record.get("JobState") == "PENDING"
        and record.get("Reason") == "BeginTime"
        and int(record.get("Restarts", "0") or 0) > 0
        and marker.is_file()
    )


def status_from_record(record: dict[str, str], preempted_marker: bool = False) -> JobStatus:
    """Map one `scontrol show job` record (or the same fields from sacct) to a JobStatus.

    `preempted_marker`: the worker left its emergency-checkpoint marker in the run directory.
    """
    raw_state = record.get("JobState", "UNKNOWN").split("+")[0].split()[0]
    reason = record.get("Reason", "None")
    restarts = int(record.get("Restarts", "0") or 0)
    exit_code, _, signal = record.get("ExitCode", "").partition(":")
    state = _STATES.get(raw_state)
    # Slurm reports 0:0 before a job ends; an exit code only means something once it has.
    ended = state is None or state.finished or raw_state in ("PREEMPTED", "COMPLETING")
    code = int(exit_code) if exit_code.isdigit() and ended else None
    if state is None:
        # Keep following a job in a state this table does not know rather than call it failed.
        return JobStatus(JobState.PENDING, f"Slurm state {raw_state} (not recognised)", code, restarts, restarts)
    why = f"Slurm {raw_state}" + (f" ({reason})" if reason not in ("None", "") else "")
    # Without accounting Slurm keeps no preemption counter; on this platform a requeue happens on
    # preemption (PreemptMode=REQUEUE), so requeues count as preemptions.
    preemptions = restarts
    if state is JobState.PENDING and restarts:
        state = JobState.REQUEUED
        why = f"requeued after preemption, attempt {restarts + 1} waiting ({reason})"
    elif raw_state == "SIGNALING":
        why = "Slurm is signalling the job (preemption or time limit): the workers write an emergency checkpoint"
    elif raw_state == "SUSPENDED":
        why = "suspended by preemption (PreemptMode=SUSPEND); Slurm resumes it"
        preemptions = restarts + 1
    elif state is JobState.RUNNING and restarts:
        why = f"running attempt {restarts + 1} after {restarts} requeue(s)"
    elif state is JobState.PREEMPTED:
        preemptions = restarts + 1
    elif state is JobState.FAILED and (code == PREEMPTED_EXIT_CODE or preempted_marker):
        state = JobState.PREEMPTED
        why = f"{why}: the worker wrote an emergency checkpoint and stopped; resubmit to resume"
        preemptions = restarts + 1
    elif state is JobState.FAILED and raw_state == "TIMEOUT":
        why = f"{why}: hit slurm.time_limit; raise it or resubmit to resume from the last checkpoint"
    elif signal not in ("", "0") and state is JobState.FAILED:
        why = f"{why}, killed by signal {signal}"
    return JobStatus(state=state, reason=why, exit_code=code, preemptions=preemptions, restarts=restarts)
