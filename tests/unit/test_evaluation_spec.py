"""The spec's `evaluation`: what it may name, and a script that cannot report a metric refused before launch."""

import hashlib
from pathlib import Path

import pytest
import yaml

from training_platform.errors import SpecError
from training_platform.policy.preflight import check_evaluation
from training_platform.spec import canonical_json, load_spec, parse_spec
from training_platform.spec.submission import OWN_CODE_ASSETS, RUN_ASSETS, assets_for

MINIMAL = {"name": "digits", "team": "vision", "owner": "ada"}
REPORTS_F1 = """
from training_platform.train.session import TrainingSession

def evaluate(model, test):
    return {"accuracy": 1.0, "loss": 0.0, "f1": 1.0}

session = TrainingSession.start()
session.evaluate_with(evaluate)
"""


def _script_spec(tmp_path: Path, script: str, evaluation: dict | None) -> object:
    (tmp_path / "train.py").write_text(script)
    data = {**MINIMAL, "entrypoint": {"script": "train.py"}} | ({"evaluation": evaluation} if evaluation else {})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    return load_spec(tmp_path / "spec.yaml")


def test_defaults_and_an_old_specs_hash_are_unchanged():
    spec = parse_spec(MINIMAL)
    assert spec.evaluation is None and spec.evaluated.metrics == ["accuracy", "loss"]
    assert spec.evaluated.gate.metric == "accuracy" and spec.evaluated.gate.direction == "maximize"
    # Declaring the defaults is a different spec; leaving the section out hashes as before the field existed.
    without_field = {k: v for k, v in spec.model_dump(mode="json").items() if k != "evaluation"}
    assert spec.spec_hash() == hashlib.sha256(canonical_json(without_field).encode()).hexdigest()
    declared = parse_spec({**MINIMAL, "evaluation": {}})
    assert declared.spec_hash() != spec.spec_hash()


def test_the_gate_metric_must_be_reported_and_templates_report_only_accuracy_and_loss():
    with pytest.raises(SpecError, match=r"gate.metric 'f1' is not among metrics \(accuracy, loss\); add it there"):
        parse_spec({**MINIMAL, "evaluation": {"gate": {"metric": "f1"}}})
    with pytest.raises(SpecError, match="model templates report accuracy and loss, not f1; remove them, or train"):
        parse_spec({**MINIMAL, "evaluation": {"metrics": ["accuracy", "f1"]}})
    with pytest.raises(SpecError, match="min_improvement"):
        parse_spec({**MINIMAL, "evaluation": {"gate": {"min_improvement": -1}}})
    with pytest.raises(SpecError, match="metrics"):
        parse_spec({**MINIMAL, "evaluation": {"metrics": ["Top-1"]}})


def test_a_scripts_run_is_evaluated_and_registered_when_its_spec_says_how(tmp_path):
    assert assets_for(parse_spec(MINIMAL)) == RUN_ASSETS
    assert assets_for(_script_spec(tmp_path, REPORTS_F1, None)) == OWN_CODE_ASSETS
    assert assets_for(_script_spec(tmp_path, REPORTS_F1, {"metrics": ["accuracy"]})) == RUN_ASSETS


def test_a_metric_the_script_never_reports_is_refused_before_launch(tmp_path):
    asks = {"metrics": ["accuracy", "f1"], "gate": {"metric": "f1", "direction": "maximize"}}
    check_evaluation(_script_spec(tmp_path, REPORTS_F1, asks))  # named by its evaluate function: accepted
    with pytest.raises(SpecError, match=r"train.py never reports f1_macro: the default evaluation reports accuracy "
                                        r"and loss; return f1_macro from its function given to session.evaluate_with"):
        check_evaluation(_script_spec(tmp_path, REPORTS_F1, {"metrics": ["f1_macro"], "gate": {"metric": "f1_macro"}}))
    no_evaluator = REPORTS_F1.replace("session.evaluate_with(evaluate)", "")
    with pytest.raises(SpecError, match=r"return f1 from session.evaluate_with \(it never calls it\)"):
        check_evaluation(_script_spec(tmp_path, no_evaluator, asks))
    check_evaluation(_script_spec(tmp_path, no_evaluator, {"metrics": ["loss"], "gate": {"metric": "loss",
                                                                                         "direction": "minimize"}}))


def test_a_modules_metrics_are_read_from_its_package_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "team_model"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported by the platform')\n")
    (package / "train.py").write_text(REPORTS_F1.replace("def evaluate(model, test):\n", "").replace(
        '    return {"accuracy": 1.0, "loss": 0.0, "f1": 1.0}\n', "from team_model.metrics import evaluate\n"))
    (package / "metrics.py").write_text('def evaluate(model, test):\n    return {"accuracy": 1.0, "f1": 0.5}\n')
    monkeypatch.syspath_prepend(str(tmp_path))

    def spec(metric: str):
        evaluation = {"metrics": [metric], "gate": {"metric": metric}}
        return parse_spec({**MINIMAL, "entrypoint": {"module": "team_model.train"}, "evaluation": evaluation})

    check_evaluation(spec("f1"))  # returned by a function in another file of the package: accepted
    with pytest.raises(SpecError, match=r"module team_model.train never reports f1_macro: .* return f1_macro from "
                                        r"its function given to session.evaluate_with, or remove them"):
        check_evaluation(spec("f1_macro"))
    (package / "train.py").write_text("print('no evaluation')\n")
    with pytest.raises(SpecError, match=r"return f1 from session.evaluate_with \(it never calls it\)"):
        check_evaluation(spec("f1"))
