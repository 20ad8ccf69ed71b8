"""TrainSpec validation: good specs load, bad ones are refused naming the field and the fix."""

from pathlib import Path

import pytest
import yaml

from training_platform.errors import SpecError
from training_platform.spec import load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MINIMAL = {"name": "digits", "team": "vision", "owner": "ada"}


def test_examples_load():
    specs = sorted(EXAMPLES.glob("*.yaml"))
    assert specs, "examples/ should hold at least one spec"
    for path in specs:
        if "sweep" not in path.name:
            assert load_spec(path).name


def test_own_files_are_read_from_the_spec_files_directory(tmp_path):
    example = load_spec(EXAMPLES / "own_data" / "spec.yaml")
    assert example.dataset.source == str(EXAMPLES / "own_data" / "data")
    assert example.dataset.columns.label == "cultivar"
    (tmp_path / "team").mkdir()
    data = {**MINIMAL, "dataset": {"source": "../drops/*.csv", "columns": {"label": "y"}}}
    (tmp_path / "team" / "spec.yaml").write_text(yaml.safe_dump(data))
    assert load_spec(tmp_path / "team" / "spec.yaml").dataset.source == str(tmp_path / "drops" / "*.csv")
    bucket = {**MINIMAL, "dataset": {"source": "s3://team-a/drops/", "columns": {"label": "y"}}}
    (tmp_path / "bucket.yaml").write_text(yaml.safe_dump(bucket))
    assert load_spec(tmp_path / "bucket.yaml").dataset.source == "s3://team-a/drops/"


def test_defaults_fill_a_minimal_spec():
    spec = parse_spec(MINIMAL)
    assert spec.strategy == "ddp"
    assert spec.resources.world_size == 2
    assert spec.dataset.source == "sklearn_digits"


def test_spec_hash_is_stable_and_sensitive():
    a, b = parse_spec(MINIMAL), parse_spec(dict(MINIMAL))
    assert a.spec_hash() == b.spec_hash()
    changed = parse_spec({**MINIMAL, "training": {"seed": 1}})
    assert changed.spec_hash() != a.spec_hash()


def _with(path: str, value):
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in MINIMAL.items()}
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return data


BAD = [
    # (mutation, field named in the error, a word of the fix)
    (_with("colour", "blue"), "colour", "unknown field"),
    (_with("training.learning_rat", 0.1), "training.learning_rat", "learning_rate"),
    (_with("resources.procs_per_node", 0), "resources.procs_per_node", ">= 1"),
    (_with("resources.procs_per_node", -2), "resources.procs_per_node", ">= 1"),
    (_with("resources.nodes", 0), "resources.nodes", ">= 1"),
    (_with("resources.gpus_per_node", -1), "resources.gpus_per_node", "0"),
    (_with("resources.gpu_type", "V100"), "resources.gpu_type", "H100"),
    (_with("resources.priority", "urgent"), "resources.priority", "high"),
    (_with("strategy", "horovod"), "strategy", "ddp"),
    (_with("model.template", "resnet9000"), "model.template", "digits_mlp"),
    (_with("model.size", "huge"), "model.size", "small"),
    (_with("dataset.snapshot_id", "not-a-hash"), "dataset.snapshot_id", "64"),
    (_with("dataset.source", "imagenet"), "dataset.source", "sklearn_digits"),
    (_with("training.max_steps", 0), "training.max_steps", ">= 1"),
    (_with("training.batch_size", 0), "training.batch_size", ">= 1"),
    (_with("training.learning_rate", -0.1), "training.learning_rate", "> 0"),
    (_with("training.optimizer", "lbfgs"), "training.optimizer", "adam"),
    (_with("checkpoint.every_steps", 0), "checkpoint.every_steps", ">= 1"),
    (_with("checkpoint.every_steps", "sometimes"), "checkpoint.every_steps", "auto"),
    (_with("checkpoint.every_steps", True), "checkpoint.every_steps", "auto"),
    (_with("checkpoint", {"every_steps": "auto", "mtbf_seconds": float("inf")}), "checkpoint.mtbf_seconds", "finite"),
    (_with("checkpoint.mtbf_seconds", 600), "checkpoint", "every_steps: auto"),
    (_with("checkpoint", {"every_steps": "auto", "mtbf_seconds": 0}), "checkpoint.mtbf_seconds", "greater than 0"),
    (_with("checkpoint.keep_last", 0), "checkpoint.keep_last", ">= 1"),
    (_with("checkpoint.keep_every_steps", 0), "checkpoint.keep_every_steps", ">= 1"),
    (_with("checkpoint.keep_best", {"mode": "min"}), "checkpoint.keep_best.metric", "required"),
    (_with("checkpoint.keep_best", {"metric": "val_loss", "mode": "lowest"}), "checkpoint.keep_best.mode", "'min'"),
    (_with("checkpoint.keep_best", {"metric": "val_loss", "count": 0}), "checkpoint.keep_best.count", ">= 1"),
    (
        _with("checkpoint.keep_best", {"metric": "val_loss", "top": 3}),
        "checkpoint.keep_best.top",
        "one of: metric, mode",
    ),
    (_with("checkpoint.store_uri", "gs://bucket/x"), "checkpoint.store_uri", "s3://"),
    (_with("checkpoint.store_uri", "s3:///nobucket"), "checkpoint.store_uri", "bucket"),
    (_with("name", "Bad Name!"), "name", "lowercase"),
    (_with("backend", "mesos"), "backend", "slurm"),
    ({"team": "vision", "owner": "ada"}, "name", "required"),
    (_with("resources", {"gpu_type": "H100"}), "resources", "gpus_per_node"),
    (_with("resources", {"gpus_per_node": 1, "procs_per_node": 2}), "resources", "one process per GPU"),
    (_with("dataset", {"source": None}), "dataset", "snapshot_id"),
    (_with("dataset.source", "wine"), "dataset.source", "your own files: a path such as ./wine"),
    (_with("dataset", {"source": "./wine"}), "dataset", "name their label column in dataset.columns.label"),
    (_with("dataset", {"source": "sklearn_digits", "split": {"key": "id"}}), "dataset", "describe your own files"),
    (_with("dataset", {"source": "s3:///wine", "columns": {"label": "y"}}), "dataset.source", "names no bucket"),
    (_with("dataset", {"source": "gs://b/wine", "columns": {"label": "y"}}), "dataset.source", "s3://"),
    (
        _with("dataset", {"source": "./w", "columns": {"label": "y"}, "split": {"fractions": {"train": 0.5}}}),
        "dataset.split.fractions",
        "make them sum to 1",
    ),
]


@pytest.mark.parametrize(("data", "field", "fix"), BAD, ids=[case[1] + ":" + case[2] for case in BAD])
def test_bad_specs_are_refused_naming_field_and_fix(data, field, fix):
    with pytest.raises(SpecError) as excinfo:
        parse_spec(data, source="spec.yaml")
    message = str(excinfo.value)
    assert f"spec.yaml: {field}" in message
    assert fix in message
    assert SpecError.exit_code == 2


def test_not_a_mapping(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(path)


def test_invalid_yaml(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_round_trip_through_yaml(tmp_path):
    spec = parse_spec(_with("training.seed", 42))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    assert load_spec(path) == spec


@pytest.mark.parametrize(("value", "parsed"), [(50, 50), ("50", 50), (50.0, 50), ("auto", "auto")])
def test_every_steps_takes_a_number_as_before_or_auto(value, parsed):
    assert parse_spec(_with("checkpoint.every_steps", value)).checkpoint.every_steps == parsed
