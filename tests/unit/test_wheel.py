"""The built wheel is the whole platform: an installed `tp` and `tp server` need nothing from the source tree.

The server's code server loads `definitions` and its instance config names the run coordinator; `tp demo` and
the nightly retraining read their specs. All of them must come from the wheel, not from a checkout beside it.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from training_platform.shipped import DAILY_SPEC, DEMO_SPEC, INSTANCE_CONFIG

ROOT = Path(__file__).resolve().parents[2]
CODE = ("training_platform", "training_platform_dagster", "assets", "resources", "sensors")
NOT_SOURCE = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "test-artifacts", "tests")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds, from a copy of the tree (building writes beside the sources)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", work, source],
        capture_output=True, text=True, timeout=240,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = work.glob("*.whl")
    return path


def test_the_wheel_holds_every_module_of_the_code_location_and_the_shipped_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        str(path.relative_to(ROOT)) for package in CODE for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert sources - names == set(), "modules missing from the wheel (pyproject.toml's packages.find)"
    assert "definitions.py" in names
    shipped = {str(path.relative_to(ROOT)) for path in (DEMO_SPEC, DAILY_SPEC, INSTANCE_CONFIG)}
    assert shipped <= names
    coordinator = yaml.safe_load(INSTANCE_CONFIG.read_text())["run_coordinator"]["module"]
    assert coordinator.replace(".", "/") + ".py" in names


def test_the_source_trees_examples_and_instance_config_are_the_shipped_files():
    assert (ROOT / "examples" / "digits.yaml").resolve() == DEMO_SPEC
    assert (ROOT / "examples" / "digits-daily.yaml").resolve() == DAILY_SPEC
    assert (ROOT / "deploy" / "dagster" / "dagster.yaml").resolve() == INSTANCE_CONFIG


def test_the_installed_package_loads_the_code_location_and_its_specs_from_itself(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import definitions, training_platform, training_platform_dagster.run_coordinator\n"
        "from training_platform.paths import SOURCE_CHECKOUT\n"
        "from training_platform.shipped import DEMO_SPEC, DAILY_SPEC, INSTANCE_CONFIG\n"
        "from training_platform.spec import load_spec\n"
        "from sensors.retraining import RetrainingConfig\n"
        f"site = {str(site)!r}\n"
        "assert training_platform.__file__.startswith(site), training_platform.__file__\n"
        "assert definitions.__file__.startswith(site), definitions.__file__\n"
        "assert SOURCE_CHECKOUT is None, SOURCE_CHECKOUT\n"
        "assert str(RetrainingConfig().spec_path).startswith(site)\n"
        "for path in (DEMO_SPEC, DAILY_SPEC, INSTANCE_CONFIG):\n"
        "    assert str(path).startswith(site) and path.is_file(), path\n"
        "load_spec(DEMO_SPEC), load_spec(DAILY_SPEC)\n"
        "assert definitions.defs.get_job_def('training_pipeline') is not None\n"
    )
    # PYTHONPATH comes before site-packages, so the wheel's files win over the editable install's.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path), "TP_HOME": str(tmp_path / "home")}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
