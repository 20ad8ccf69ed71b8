"""A tiny code location for queue benchmarks: one short job, and a sensor that submits every team's runs at once.

The sensor fires once (its cursor remembers), when the file named by $FAIRNESS_TRIGGER exists, and
asks for TEAMS x $FAIRNESS_RUNS_PER_TEAM runs in team blocks (all of team-a's first): the order in
which a plain FIFO queue would let the first team take every slot. $FAIRNESS_TEAMS (comma-separated)
picks the teams, three by default.
"""

import os
import time
from pathlib import Path

import dagster as dg

DEFAULT_TEAMS = ("team-a", "team-b", "team-c")
TEAMS = tuple(os.environ.get("FAIRNESS_TEAMS", ",".join(DEFAULT_TEAMS)).split(","))
RUNS_PER_TEAM = int(os.environ.get("FAIRNESS_RUNS_PER_TEAM", "10"))


@dg.op(config_schema={"seconds": float})
def work(context: dg.OpExecutionContext) -> None:
    time.sleep(context.op_config["seconds"])


# In-process executor: one process per run (the run worker), not one more per step.
@dg.job(tags={"fairness": "1"}, executor_def=dg.in_process_executor)
def short_run():
    work()


@dg.sensor(job=short_run, minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING)
def submit_all(context: dg.SensorEvaluationContext):
    trigger = Path(os.environ["FAIRNESS_TRIGGER"])
    if context.cursor == "submitted":
        return dg.SkipReason("already submitted")
    if not trigger.is_file():
        return dg.SkipReason("waiting for the trigger file")
    seconds = float(trigger.read_text() or 2)
    context.update_cursor("submitted")
    return [
        dg.RunRequest(
            run_key=f"{team}-{i}",
            run_config={"ops": {"work": {"config": {"seconds": seconds}}}},
            tags={"team": team, "dagster/priority": "0"},
        )
        for team in TEAMS
        for i in range(RUNS_PER_TEAM)
    ]


defs = dg.Definitions(jobs=[short_run], sensors=[submit_all])
