"""Map a Job, its Kueue Workload and its Pods (plain API dicts, camelCase) to a JobStatus.

The order of the checks is the order of precedence: a finished Job is final whatever Kueue
says; an evicted Workload explains a suspended Job better than the Job does; a disrupted pod
explains a running Job that is about to lose a node.

Kueue's Workload conditions (v1beta1 and v1beta2 alike): QuotaReserved, Admitted, Evicted
(reason Preempted, PodsReadyTimeout, InactiveWorkload, ...), Preempted, Requeued, PodsReady,
Finished. When a Workload gets quota again, Kueue flips Evicted and Preempted back to False.
"""

from __future__ import annotations

from typing import Any

from training_platform.launch.base import PREEMPTED_EXIT_CODE, JobState, JobStatus

Obj = dict[str, Any]


def condition(obj: Obj | None, kind: str) -> Obj | None:
    """The condition of type `kind` whose status is True, if any."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _says(cond: Obj) -> str:
    return f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")


def eviction_counts(workload: Obj | None) -> tuple[int, int]:
    """(evictions by preemption, all evictions) so far, from the Workload's scheduling stats."""
    status = (workload or {}).get("status") or {}
    evictions = (status.get("schedulingStats") or {}).get("evictions") or []
    preempted = sum(int(e.get("count", 0)) for e in evictions if e.get("reason") == "Preempted")
    total = sum(int(e.get("count", 0)) for e in evictions)
    if not evictions:
        # Older Kueue versions keep no stats: count the current eviction, or the requeues.
        total = int((status.get("requeueState") or {}).get("count", 0))
        evicted = condition(workload, "Evicted")
        if evicted and evicted.get("reason") == "Preempted":
            preempted, total = max(1, total), max(1, total)
    return preempted, total


def _exit_code(pods: list[Obj]) -> int | None:
    codes = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated is not None:
                codes.append(int(terminated.get("exitCode", 0)))
    failing = [c for c in codes if c != 0]
    return failing[0] if failing else (codes[0] if codes else None)


def _live(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]


def job_status(job: Obj | None, workload: Obj | None, pods: list[Obj]) -> JobStatus:
    """The run's state from what the API server says about its Job, Workload and Pods."""
    preemptions, restarts = eviction_counts(workload)

    def status(state: JobState, reason: str, exit_code: int | None = None) -> JobStatus:
        return JobStatus(state, reason, exit_code, preemptions, restarts)

    if job is None:
        return status(JobState.CANCELLED, "the Job no longer exists (cancelled or deleted)")
    if done := condition(job, "Complete"):
        return status(JobState.SUCCEEDED, f"Job complete ({_says(done)})", 0)
    if failed := condition(job, "Failed"):
        code = _exit_code(pods)
        if code == PREEMPTED_EXIT_CODE:
            return status(JobState.PREEMPTED, f"stopped after an emergency checkpoint ({_says(failed)})", code)
        return status(JobState.FAILED, f"Job failed: {_says(failed)}", code)
    if finished := condition(workload, "Finished"):
        # Kueue saw the end before the Job controller wrote its condition.
        state = JobState.SUCCEEDED if finished.get("reason") == "Succeeded" else JobState.FAILED
        return status(state, f"Workload finished: {_says(finished)}", _exit_code(pods))
    if evicted := condition(workload, "Evicted"):
        if (workload or {}).get("spec", {}).get("active") is False:
            return status(JobState.FAILED, f"Kueue deactivated the workload: {_says(evicted)}")
        if _live(pods):
            return status(JobState.PREEMPTED, f"Kueue is evicting the run, pods are stopping: {_says(evicted)}")
        waiting = condition(workload, "QuotaReserved") is None
        reason = f"evicted by Kueue ({_says(evicted)}) and requeued" + (", waiting for quota" if waiting else "")
        return status(JobState.REQUEUED, reason)
    disrupted = [p for p in _live(pods) if condition(p, "DisruptionTarget")]
    if disrupted:
        cond = condition(disrupted[0], "DisruptionTarget") or {}
        name = disrupted[0].get("metadata", {}).get("name", "?")
        return status(JobState.PREEMPTED, f"pod {name} is being disrupted ({_says(cond)}); the Job will replace it")
    if workload is None:
        if (job.get("spec") or {}).get("suspend"):
            return status(
                JobState.PENDING,
                "no Kueue Workload yet: check that Kueue runs and the Job's queue-name label names a LocalQueue",
            )
        return _running_or_starting(job, pods, status)
    if admitted := condition(workload, "Admitted"):
        return _running_or_starting(job, pods, status, admitted)
    if reserved := condition(workload, "QuotaReserved"):
        return status(JobState.PENDING, f"quota reserved, waiting for admission checks ({_says(reserved)})")
    pending = next(
        (c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == "QuotaReserved"),
        None,
    )
    state = JobState.REQUEUED if restarts else JobState.PENDING
    return status(state, f"queued in Kueue: {_says(pending) if pending else 'waiting for quota'}")


def _running_or_starting(job: Obj, pods: list[Obj], status, admitted: Obj | None = None) -> JobStatus:
    job_status_ = job.get("status") or {}
    wanted = int((job.get("spec") or {}).get("parallelism", 1))
    running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
    if running >= wanted or int(job_status_.get("ready", 0) or 0) >= wanted:
        return status(JobState.RUNNING, f"{running} of {wanted} pods running")
    where = f" ({_says(admitted)})" if admitted else ""
    return status(JobState.PENDING, f"admitted{where}; {running} of {wanted} pods running, the rest starting")
