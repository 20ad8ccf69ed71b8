"""Alert rules: pure functions over run records, with thresholds in config.

Each rule returns an `Alert` (what is wrong, on which run, what to look at) or None. Per-run
rules become asset checks on `training_run`; the alert sensor evaluates, while they happen, the live
rules (utilization of a running run, a run stuck in the queue) and the team rules (failure rate over
a day, an hour's spend against the trailing mean). Nothing here reads clocks or files: callers pass
`now`, the records and the spend.

Each rule has its own debounce: an utilization alert needs a whole window under the floor, a queue
alert the whole wait; both fire once per run. A team's failure-rate alert fires at most once per day,
its spend alert once per hour (`Alert.key`: the sensor delivers each key once).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
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
    failure_rate_max: float = Field(0.05, ge=0, le=1, description="alert when a team's failure share exceeds this ...")
    failure_rate_period_s: float = Field(86400.0, gt=0, description="... among its runs that ended in this period")
    failure_rate_min_runs: int = Field(20, ge=1, description="finished runs a team needs in the period to be judged")
    spend_max_ratio: float = Field(2.0, gt=1, description="alert when a team's last hour costs this x its hourly mean")
    spend_trailing_hours: int = Field(24, ge=1, description="hours before the last one that make the mean")
    spend_min_history_hours: int = Field(
        3, ge=1, description="hours with spend a team needs in the trailing window before it is judged"
    )
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
    team: str = ""
    period: str = ""
    """the debounce period of a team rule (a day, an hour); empty: once per run"""

    @property
    def key(self) -> str:
        """What the sensor delivers once: the rule and its run, or its team and period."""
        return f"{self.rule}:{self.team}:{self.period}" if self.period else f"{self.rule}:{self.run_id}"

    def text(self) -> str:
        subject = f"team {self.team}" if self.period else f"run {self.run_id}"
        return f"[{self.rule}] {subject}: {self.what}. Look at: {self.look_at}"

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


def failure_rates(runs: Sequence[RunRecord], th: AlertThresholds, now: float) -> list[Alert]:
    """Per team, the share of failures among its runs that ended in the last period (a day)."""
    since = now - th.failure_rate_period_s
    by_team: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        if run.finished and run.ended_at is not None and run.ended_at >= since:
            by_team[run.team or "-"].append(run)
    alerts = []
    for team, finished in sorted(by_team.items()):
        if len(finished) < th.failure_rate_min_runs:
            continue
        failed = sorted((r for r in finished if r.status == "FAILED"), key=lambda r: r.ended_at or 0.0)
        rate = len(failed) / len(finished)
        if rate <= th.failure_rate_max:
            continue
        shown = ", ".join(r.run_id for r in failed[-5:])
        alerts.append(
            Alert(
                rule="failure_rate",
                run_id=failed[-1].run_id,
                what=f"{len(failed)} of its {len(finished)} runs of the last {th.failure_rate_period_s / 3600:g} h "
                f"failed ({rate:.0%}, limit {th.failure_rate_max:.0%}); latest {failed[-1].run_id}",
                look_at=f"the failed runs' logs (`tp logs RUN`: {shown}); a common cause: bad data, an image or a node",
                value=rate,
                threshold=th.failure_rate_max,
                severity="ERROR",
                team=team,
                period=_period(now, th.failure_rate_period_s),
            )
        )
    return alerts


def spend_spikes(spend: Iterable[tuple[str, float, float]], th: AlertThresholds, now: float) -> list[Alert]:
    """Per team, the last hour's spend against the mean hour of the trailing window before it.

    `spend`: (team, epoch seconds, dollars) items, such as the cost ledger's records. The mean counts
    the window's idle hours too: an hour that costs twice a team's usual day-long rate is the signal.
    """
    hour = 3600.0
    start = now - hour - th.spend_trailing_hours * hour
    last: dict[str, float] = defaultdict(float)
    trailing: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for team, at, usd in spend:
        if now - hour < at <= now:
            last[team] += usd
        elif start < at <= now - hour:
            trailing[team][int((at - start) // hour)] += usd
    alerts = []
    for team, current in sorted(last.items()):
        history = trailing.get(team, {})
        if sum(1 for usd in history.values() if usd > 0) < th.spend_min_history_hours:
            continue
        mean = sum(history.values()) / th.spend_trailing_hours
        if mean <= 0 or current <= th.spend_max_ratio * mean:
            continue
        alerts.append(
            Alert(
                rule="spend_spike",
                run_id="-",
                what=f"spent ${current:.2f} in the last hour, {current / mean:.1f}x its mean ${mean:.2f} per hour "
                f"over the {th.spend_trailing_hours} h before (limit {th.spend_max_ratio:g}x)",
                look_at=f"`tp cost report --team {team}` and `tp status --team {team}`: a sweep or retry loop, runs "
                "on on-demand capacity, or bigger requests than usual",
                value=current / mean,
                threshold=th.spend_max_ratio,
                team=team,
                period=_period(now, hour),
            )
        )
    return alerts


def _period(now: float, seconds: float) -> str:
    """The debounce bucket `now` falls in, as its start (UTC epoch seconds)."""
    return str(int(now // seconds * seconds))


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
LIVE_RULES = ("low_utilization", "queue_wait")
TEAM_RULES = ("failure_rate", "spend_spike")


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


def evaluate_live(
    runs: Sequence[RunRecord], th: AlertThresholds, now: float, spend: Iterable[tuple[str, float, float]] = ()
) -> list[Alert]:
    """What is wrong now: team rules, runs still waiting in the queue, running runs idling."""
    alerts = failure_rates(runs, th, now) + spend_spikes(spend, th, now)
    for run in runs:
        if run.finished:
            continue
        alert = queue_wait(run, th, now) if run.started_at is None else low_utilization(run, th)
        if alert is not None:
            alerts.append(alert)
    return alerts
