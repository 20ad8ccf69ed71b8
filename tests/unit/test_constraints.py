"""What CI and the training image install is pinned (constraints.txt), and DeepSpeed is an optional extra."""

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from training_platform.errors import SpecError
from training_platform.paths import PlatformHome
from training_platform.policy.preflight import preflight
from training_platform.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "kubernetes" / "image" / "Dockerfile").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"constraints.txt: {line} is not an exact pin"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _project_requirements() -> list[Requirement]:
    listed = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    return [r for r in map(Requirement, listed) if canonicalize_name(r.name) != "training-platform"]


def test_everything_ci_and_the_image_install_is_pinned_and_satisfies_the_projects_ranges():
    pins = _pins()
    # The image's quoted requirements (torch comes from its own index, pinned by ARG TORCH_VERSION).
    image = [Requirement(r) for r in re.findall(r'"([A-Za-z0-9_.-]+[=<>~!][^"$]*)"', DOCKERFILE)]
    assert len(image) >= 10
    for requirement in [*_project_requirements(), *image]:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is installed but not pinned in constraints.txt"
        assert Version(pins[name]) in requirement.specifier, f"constraints.txt pins {name}=={pins[name]}: {requirement}"


def test_ci_and_the_image_install_with_the_constraints():
    assert "pip install --quiet --no-compile -c constraints.txt -e '.[dev]'" in (ROOT / "Makefile").read_text()
    installs = [line for line in DOCKERFILE.splitlines() if "pip install" in line and "torch==" not in line]
    assert installs and all("-c /tmp/constraints.txt" in line for line in installs)
    assert "COPY constraints.txt /tmp/constraints.txt" in DOCKERFILE


def test_this_environment_has_the_pinned_versions_of_the_projects_dependencies():
    pins = _pins()
    for requirement in _project_requirements():
        try:
            installed = Version(version(requirement.name)).public
        except PackageNotFoundError:
            continue  # an extra this environment does not install
        assert installed == pins[canonicalize_name(requirement.name)], f"{requirement.name} {installed}: reinstall"


def test_deepspeed_is_an_extra_and_its_absence_is_explained(monkeypatch, tmp_path):
    assert not [r for r in PROJECT["dependencies"] if Requirement(r).name == "deepspeed"]
    assert [r for r in PROJECT["optional-dependencies"]["deepspeed"] if Requirement(r).name == "deepspeed"]
    from training_platform.train.strategies.deepspeed import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now raises ImportError
    with pytest.raises(SpecError, match=r"deepspeed is not installed .*pip install 'training-platform\[deepspeed\]'"):
        import_deepspeed()
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "deepspeed" else object())
    home = PlatformHome(tmp_path).ensure()
    spec = parse_spec({"name": "z", "team": "qa", "owner": "ci", "strategy": "deepspeed"})
    with pytest.raises(SpecError, match=r"^strategy: deepspeed is not installed in this environment; pip install"):
        preflight(spec, home, str(home.checkpoints))
