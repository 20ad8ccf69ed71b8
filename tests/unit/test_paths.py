"""Run ids and the directories they name: a run id cannot leave `$TP_HOME/runs`."""

import os

import pytest

from training_platform.errors import SpecError
from training_platform.paths import PlatformHome
from training_platform.runs.specs import load_run_spec, register_run
from training_platform.spec import parse_spec
from training_platform.sweeps.queue import SweepQueue


@pytest.mark.parametrize("run_id", ["../../x", "/tmp/x", "..", "a/../../b", "a/b", "", "x\n", "-rf"])
def test_a_run_id_that_is_not_one_plain_name_is_refused(tmp_path, run_id):
    home = PlatformHome(tmp_path / "home").ensure()
    with pytest.raises(SpecError, match="run id .* is not allowed"):
        home.run_dir(run_id)


def test_a_partition_key_cannot_register_or_load_a_spec_outside_the_runs_directory(tmp_path):
    # The reported attack: a partition key `../../x` made the training asset read and write outside runs/.
    home = PlatformHome(tmp_path / "home").ensure()
    spec = parse_spec({"name": "a", "team": "b", "owner": "c"})
    with pytest.raises(SpecError):
        register_run(home, spec, "../../outside")
    with pytest.raises(SpecError):
        load_run_spec(home, "../../outside")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_run_directory_linked_outside_the_home_is_refused(tmp_path):
    home = PlatformHome(tmp_path / "home").ensure()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", home.runs / "linked")
    with pytest.raises(SpecError, match="outside"):
        home.run_dir("linked")
    assert home.run_dir("r-20250101-000000-ab12") == home.runs.resolve() / "r-20250101-000000-ab12"


def test_a_sweep_partition_key_cannot_name_a_file_outside_the_queue(tmp_path):
    with pytest.raises(SpecError, match="sweep name"):
        SweepQueue(tmp_path).get("../../../etc/passwd")
