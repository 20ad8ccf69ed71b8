"""Teams are declared, not free text: a spec may use only its own team's namespace, queue, service
account, Secrets, Slurm account, partitions and QoS, and every entry point refuses the rest in preflight."""

from __future__ import annotations

import pytest
import yaml

from training_platform.cost import BudgetError, CostLedger, check_budget, run_cost
from training_platform.errors import SpecError
from training_platform.launch.base import RunRequest
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.launch.slurm import SlurmLauncher
from training_platform.paths import PlatformHome
from training_platform.policy.preflight import preflight
from training_platform.policy.teams import TEAMS_ENV, load_teams
from training_platform.spec import load_spec, parse_spec

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
TEAMS = {
    "teams": {
        "vision": {
            "monthly_usd": 500,
            "members": ["ada", "grace"],
            "default_priority": "high",
            "kubernetes": {
                "namespace": "vision-training",
                "queue": "vision-gpus",
                "service_account": "vision-trainer",
                "secrets": ["vision-s3"],
            },
            "slurm": {"account": "vision", "partitions": ["ondemand"], "qos": ["normal"]},
        },
        "nlp": {
            "kubernetes": {"namespace": "nlp", "service_account": "nlp-trainer", "secrets": ["nlp-s3-credentials"]},
            "slurm": {"account": "nlp", "partitions": ["spot", "ondemand"]},
        },
    }
}


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    home = PlatformHome(tmp_path / "home").ensure()
    (home.root / "teams.yaml").write_text(yaml.safe_dump(TEAMS))
    monkeypatch.delenv(TEAMS_ENV)  # the home's own teams file, not the tests' shared one
    return home


def _spec(**fields):
    return parse_spec({"name": "resnet", "team": "vision", "owner": "ada", **fields})


def _preflight(home: PlatformHome, spec):
    return preflight(spec, home, str(home.checkpoints))


def test_the_reported_cross_team_spec_is_refused_in_one_line(home):
    # team vision, namespace nlp, nlp's Secret: rendered a Job in nlp that loaded nlp's credentials.
    spec = _spec(backend="k8s", kubernetes={"namespace": "nlp", "secret_refs": ["nlp-s3-credentials"]})
    with pytest.raises(SpecError) as refused:
        _preflight(home, spec)
    message = str(refused.value)
    assert message.startswith("kubernetes.namespace: 'nlp' is not team 'vision''s; use one of: vision-training")
    assert "teams.yaml (teams.vision)" in message and "\n" not in message and refused.value.exit_code == 2


@pytest.mark.parametrize(
    ("fields", "field", "offer"),
    [
        ({"kubernetes": {"queue": "nlp-queue"}}, "kubernetes.queue", "vision-gpus, vision-sweeps"),
        ({"kubernetes": {"service_account": "nlp-trainer"}}, "kubernetes.service_account", "vision-trainer"),
        ({"kubernetes": {"secret_refs": ["vision-s3", "nlp-s3-credentials"]}}, "kubernetes.secret_refs", "vision-s3"),
        ({"slurm": {"account": "nlp"}}, "slurm.account", "vision"),
        ({"backend": "slurm", "slurm": {"partition": "spot"}}, "slurm.partition", "ondemand"),
        ({"backend": "slurm", "slurm": {"qos": "high"}}, "slurm.qos", "normal"),
        # What the launcher derives must be the team's too: spot capacity -> the `spot` partition.
        ({"backend": "slurm", "resources": {"spot": True}}, "resources.spot", "ondemand"),
        ({"backend": "slurm", "resources": {"priority": "low"}}, "resources.priority", "normal"),
    ],
)
def test_any_other_teams_resource_is_refused_naming_the_field_and_the_teams_own(home, fields, field, offer):
    refusal = rf"^{field}: '[^']+' is not team 'vision''s; use one of: {offer}, or declare it in "
    with pytest.raises(SpecError, match=refusal):
        _preflight(home, _spec(**fields))


def test_a_team_without_a_service_account_or_slurm_account_may_not_name_one(home):
    spec = parse_spec({"name": "r", "team": "nlp", "owner": "x", "kubernetes": {"service_account": "vision-trainer"}})
    with pytest.raises(SpecError, match="^kubernetes.service_account: 'vision-trainer' is not team 'nlp''s; use one"):
        _preflight(home, spec)
    (home.root / "teams.yaml").write_text(yaml.safe_dump({"teams": {"nlp": {}}}))
    with pytest.raises(SpecError, match="^slurm.account: 'nlp' is not team 'nlp''s; remove it"):
        _preflight(home, parse_spec({"name": "r", "team": "nlp", "owner": "x", "slurm": {"account": "nlp"}}))


def test_an_undeclared_team_and_a_non_member_are_refused_with_the_file_to_fix(home):
    with pytest.raises(SpecError, match=r"^team: 'visoin' is not declared in .*teams.yaml \(declared: nlp, vision\)"):
        _preflight(home, parse_spec({"name": "r", "team": "visoin", "owner": "ada"}))
    with pytest.raises(SpecError, match=r"^owner: 'mallory' is not a member of team 'vision'; add them to its members"):
        _preflight(home, _spec(owner="mallory"))


def test_a_spec_within_its_team_runs_with_the_teams_namespace_queue_account_and_priority(home):
    spec = _preflight(home, _spec(backend="k8s", kubernetes={"secret_refs": ["vision-s3"]}))
    assert spec.resources.priority == "high"  # the team's default_priority: the spec sets none
    plan = KubernetesLauncher().plan(RunRequest(spec=spec, run_id="r-1", run_dir=home.run_dir("r-1")))
    job = list(yaml.safe_load_all(plan.files["manifests.yaml"]))[-1]
    assert job["metadata"]["namespace"] == "vision-training"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision-gpus"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "vision-trainer"
    slurm = _preflight(home, _spec(backend="slurm", resources={"priority": "normal"}))
    script = SlurmLauncher().plan(RunRequest(spec=slurm, run_id="r-2", run_dir=home.run_dir("r-2"))).files
    assert "#SBATCH --account=vision" in script["job.sbatch"] and "#SBATCH --partition=ondemand" in script["job.sbatch"]


def test_a_fresh_home_declares_the_examples_team_and_refuses_others_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(TEAMS_ENV)
    home = PlatformHome(tmp_path / "fresh").ensure()
    spec = load_spec(EXAMPLES / "digits.yaml")
    assert _preflight(home, spec).team == "ml-platform"  # `make demo` on a fresh clone
    declared, path = load_teams(home.root)
    assert path == home.root / "teams.yaml" and set(declared.teams) == {"ml-platform"}
    with pytest.raises(SpecError, match=rf"^team: 'vision' is not declared in {path} .*add it there"):
        _preflight(home, _spec())


def test_an_old_budgets_file_is_carried_into_the_new_teams_file(tmp_path, monkeypatch):
    monkeypatch.delenv(TEAMS_ENV)
    (tmp_path / "budgets.yaml").write_text("teams:\n  vision: {monthly_usd: 100}\n  ml-platform: {monthly_usd: 7}\n")
    declared, _ = load_teams(tmp_path)
    assert declared.teams["vision"].monthly_usd == 100 and declared.teams["ml-platform"].monthly_usd == 7


def test_budgets_come_from_the_teams_file(home):
    ledger = CostLedger(home.root / "cost")
    spec = parse_spec({"name": "r", "team": "vision", "owner": "ada", "resources": {
        "nodes": 2, "procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100"}})
    ledger.record(run_cost(spec, "r1", 3600 * 4))  # 64 GPU-hours on demand: $440
    assert check_budget(home.root, "vision", 50).allowed
    with pytest.raises(BudgetError, match=r"spent \$440.32 of \$500.00 .* Raise teams.vision.monthly_usd in "):
        check_budget(home.root, "vision", 100)
    assert check_budget(home.root, "nlp", 1e9).allowed  # declared without a budget: no limit
    with pytest.raises(SpecError, match="team: 'nobody' is not declared"):
        check_budget(home.root, "nobody", 0)


def test_a_malformed_teams_file_is_refused_naming_the_entry(home):
    (home.root / "teams.yaml").write_text("teams:\n  vision:\n    slurm: {partitions: ['gpu\\ntouch x']}\n")
    with pytest.raises(SpecError, match=r"teams.yaml: teams.vision.slurm.partitions.0: is not allowed"):
        _preflight(home, _spec())


def test_a_sweep_trial_goes_to_its_teams_sweep_queue_unless_its_spec_names_one(home):
    spec = _spec(backend="k8s")
    assert preflight(spec, home, str(home.checkpoints), sweep_trial=True).kubernetes.queue == "vision-sweeps"
    assert _preflight(home, spec).kubernetes.queue == "vision-gpus"
    named = _spec(backend="k8s", kubernetes={"queue": "vision-gpus"})
    assert preflight(named, home, str(home.checkpoints), sweep_trial=True).kubernetes.queue == "vision-gpus"
    assert _preflight(home, _spec(backend="k8s", kubernetes={"queue": "vision-sweeps"})).kubernetes.queue == (
        "vision-sweeps"
    )
