"""The queue tags of the platform's runs come from the spec each trains, whoever submitted the run."""

from datetime import UTC, datetime, timedelta

import dagster as dg

from training_platform.cost.windows import CostWindow
from training_platform.paths import PlatformHome
from training_platform.sweeps import SweepQueue, parse_sweep
from training_platform_dagster.run_coordinator import UNATTRIBUTED_TEAM, queue_tags_of

SWEEP = parse_sweep({
    "name": "lr",
    "base": {"name": "digits", "team": "vision", "owner": "ada", "resources": {"priority": "high"}},
    "search_space": {"training.learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
})


def test_a_sweep_released_from_the_queue_is_its_base_specs_team(tmp_path):
    home = PlatformHome(tmp_path).ensure()
    start = datetime.now(UTC)
    window = CostWindow(start, start + timedelta(hours=1), 1.0, 2.0, 1.0, 1, None, True, "us-east-1")
    SweepQueue(home.root).enqueue(SWEEP, window)
    released = dg.DagsterRun(job_name="sweep_job", tags={"dagster/partition": "lr", "team": "someone-else"})
    tags = queue_tags_of(released, home)
    assert tags["team"] == "vision" and tags["owner"] == "ada" and tags["dagster/priority"] == "10"
    unknown = dg.DagsterRun(job_name="sweep_job", tags={"dagster/partition": "never-queued"})
    assert queue_tags_of(unknown, home) == {"team": UNATTRIBUTED_TEAM}
    assert queue_tags_of(dg.DagsterRun(job_name="someone_elses_job"), home) == {}
