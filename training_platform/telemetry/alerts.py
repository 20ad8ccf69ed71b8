"""Alert rules: pure functions over run records, with thresholds in config.

Each rule returns an `Alert` (what is wrong, on which run, what to look at) or None. Per-run
rules become asset checks on `training_run`; fleet rules (queue wait, failure rate) run in a
sensor. Nothing here reads clocks or files: callers pass `now` and the records.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field

from training_platform.telemetry.records import RunRecord


class AlertThresholds(BaseModel):
    """When an alert fires. Defaults are the platform's policy; tests shrink the windows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    utilization_min_pct: float = Field(50.0, ge=0, le=100, description="alert when utilization stays below this %")
    utilization_window_s: float = Field(600.0, gt=0, description="... for at least this many seconds")
    data_wait_max_fraction: float = Field(0.10, ge=0, le=1, description="alert when data wait exceeds this share")
    queue_wait_max_s: float = Field(7200.0, gt=0, description="alert when a run waits longer than this to start")
    failure_rate_max: float = Field(0.05, ge=0, le=1, description="alert when the failure share exceeds this ...")
    failure_rate_window: int = Field(20, ge=1, description="... over this many most recent finished runs")
    cost_max_ratio: float = Field(3.0, gt=1, description="alert when a run costs more than this x its family median")
    cost_min_family_runs: int = Field(3, ge=1, description="finished runs a family needs before costs are compared")
    checkpoint_overhead_max: float = Field(0.02, ge=0, le=1, description="alert when checkpointing takes this share")


@dataclass(frozen=True)
class Alert:
    rule: str
    run_id: str
    what: str
    """what is wrong, with the measured value and the threshold"""
    look_at: str
    """where to look first"""
    value: float
    threshold: float
    severity: str = "WARN"

    def text(self) -> str:
        return f"[{self.rule}] run {self.run_id}: {self.what}. Look at: {self.look_at}"

    def to_dict(self) -> dict:
        return asdict(self)


def low_utilization(run: RunRecord, th: AlertThresholds) -> Alert | None:
    """Mean utilization below the floor over a whole window (any window of the run; the worst is reported).

    The mean over the window, not every single sample: samples are noisy (a step's burst, a pause
    between steps), and what costs money is a window that is idle on average.
    """
    points = run.utilization
    worst: tuple[float, float, float] | None = None  # (mean, start, end)
    begin, total = 0, 0.0
    for end, (t_end, pct) in enumerate(points):
        total += pct
        # Shrink from the left while the window without its first sample still spans the whole window.
        while begin < end and t_end - points[begin + 1][0] >= th.utilization_window_s:
            total -= points[begin][1]
            begin += 1
        if t_end - points[begin][0] < th.utilization_window_s:
            continue
        mean = total / (end - begin + 1)
        if worst is None or mean < worst[0]:
            worst = (mean, points[begin][0], t_end)
    if worst is None or worst[0] >= th.utilization_min_pct:
        return None
    mean, first, last = worst
    return Alert(
        rule="low_utilization",
        run_id=run.run_id,
        what=f"{run.device.upper()} utilization averaged {mean:.0f}% over {last - first:.0f} s "
        f"(below {th.utilization_min_pct:g}% for at least {th.utilization_window_s:g} s; "
        f"run mean {run.mean_utilization or 0:.0f}%)",
        look_at="the utilization plot and the data wait fraction of this run; a larger batch, more data "
        "loader workers, or fewer devices for this model",
        value=mean,
        threshold=th.utilization_min_pct,
    )


def data_wait(run: RunRecord, th: AlertThresholds) -> Alert | None:
    if run.data_wait_fraction is None or run.data_wait_fraction <= th.data_wait_max_fraction:
        return None
    return Alert(
        rule="data_wait",
        run_id=run.run_id,
        what=f"{run.data_wait_fraction:.0%} of the training loop waited for data "
        f"(limit {th.data_wait_max_fraction:.0%})",
        look_at="the data loader: shard read throughput (`tp doctor --bench`), the snapshot cache, "
        "prefetching and loader workers",
        value=run.data_wait_fraction,
        threshold=th.data_wait_max_fraction,
    )


def checkpoint_overhead(run: RunRecord, th: AlertThresholds) -> Alert | None:
    if run.checkpoint_overhead is None or run.checkpoint_overhead <= th.checkpoint_overhead_max:
        return None
    return Alert(
        rule="checkpoint_overhead",
        run_id=run.run_id,
        what=f"checkpoints took {run.checkpoint_overhead:.1%} of the training loop "
        f"(limit {th.checkpoint_overhead_max:.0%})",
        look_at="checkpoint.every_steps (checkpoint less often), async saving, and the store's write "
        "throughput (`tp doctor --bench`)",
        value=run.checkpoint_overhead,
        threshold=th.checkpoint_overhead_max,
    )


def queue_wait(run: RunRecord, th: AlertThresholds, now: float) -> Alert | None:
    """Time from submission to start; a run still queued is measured up to `now`."""
    if run.queued_at is None or (run.finished and run.started_at is None):
        return None
    waited = (run.started_at if run.started_at is not None else now) - run.queued_at
    if waited <= th.queue_wait_max_s:
        return None
    still = " and is still queued" if run.started_at is None else " before it started"
    return Alert(
        rule="queue_wait",
        run_id=run.run_id,
        what=f"waited {waited / 3600:.1f} h in the queue{still} (limit {th.queue_wait_max_s / 3600:g} h)",
        look_at=f"`tp status --team {run.team or 'TEAM'}`: the team's quota and running jobs, the queue's "
        "priorities, and whether the requested resources can ever fit",
        value=waited,
        threshold=th.queue_wait_max_s,
    )


def failure_rate(runs: Sequence[RunRecord], th: AlertThresholds) -> Alert | None:
    """Share of failures among the most recent finished runs (by end time)."""
    finished = sorted((r for r in runs if r.finished), key=lambda r: r.ended_at or 0.0)[-th.failure_rate_window :]
    if len(finished) < th.failure_rate_window:
        return None
    failed = [r for r in finished if r.status == "FAILED"]
    rate = len(failed) / len(finished)
    if rate <= th.failure_rate_max:
        return None
    shown = ", ".join(r.run_id for r in failed[-5:])
    return Alert(
        rule="failure_rate",
        run_id=failed[-1].run_id,
        what=f"{len(failed)} of the last {len(finished)} runs failed ({rate:.0%}, limit {th.failure_rate_max:.0%})",
        look_at=f"the failed runs' logs in the Dagster UI ({shown}); a common cause: bad data, an image or a node",
        value=rate,
        threshold=th.failure_rate_max,
        severity="ERROR",
    )


def cost_outlier(run: RunRecord, runs: Sequence[RunRecord], th: AlertThresholds) -> Alert | None:
    """A run costing more than `cost_max_ratio` x the median of its sweep (or else its family)."""
    if run.cost_usd is None:
        return None
    group = "sweep" if run.sweep else "family"
    peers = [
        r.cost_usd
        for r in runs
        if r.run_id != run.run_id
        and r.cost_usd is not None
        and r.status == "SUCCEEDED"
        and ((r.sweep == run.sweep) if run.sweep else (r.family == run.family))
    ]
    if len(peers) < th.cost_min_family_runs:
        return None
    median = statistics.median(peers)
    if median <= 0 or run.cost_usd <= th.cost_max_ratio * median:
        return None
    name = run.sweep if run.sweep else run.family
    return Alert(
        rule="cost_outlier",
        run_id=run.run_id,
        what=f"cost ${run.cost_usd:.4f}, {run.cost_usd / median:.1f}x the median ${median:.4f} of {len(peers)} "
        f"runs of its {group} {name!r} (limit {th.cost_max_ratio:g}x)",
        look_at="this run's steps, resources and utilization against its peers: a bigger request, a stall, "
        "or a retry loop",
        value=run.cost_usd / median,
        threshold=th.cost_max_ratio,
    )


RUN_RULES = ("low_utilization", "data_wait", "checkpoint_overhead", "cost_outlier", "queue_wait")
FLEET_RULES = ("failure_rate",)


def evaluate_run(
    run: RunRecord, peers: Sequence[RunRecord], th: AlertThresholds, now: float
) -> dict[str, Alert | None]:
    """Every per-run rule, by name (None: quiet)."""
    return {
        "low_utilization": low_utilization(run, th),
        "data_wait": data_wait(run, th),
        "checkpoint_overhead": checkpoint_overhead(run, th),
        "cost_outlier": cost_outlier(run, peers, th),
        "queue_wait": queue_wait(run, th, now),
    }


def evaluate_fleet(runs: Sequence[RunRecord], th: AlertThresholds, now: float) -> list[Alert]:
    """Fleet rules plus the queue-wait rule of every run still waiting."""
    alerts = [a for a in [failure_rate(runs, th)] if a is not None]
    for run in runs:
        if run.started_at is None and not run.finished:
            alert = queue_wait(run, th, now)
            if alert is not None:
                alerts.append(alert)
    return alerts
