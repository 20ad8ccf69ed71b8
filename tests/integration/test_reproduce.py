"""`tp reproduce`: a past run rebuilt from its lineage key, exact or with a precise diff."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fixtures.platform import ROOT, running_platform, server_logs

pytestmark = pytest.mark.integration


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data home, a code repository (TP_CODE_DIR) and a fake installed package on PYTHONPATH."""
    root = tmp_path_factory.mktemp("repro")
    code = root / "code"
    code.mkdir()
    git(code, "init", "-q")
    (code / "train_notes.txt").write_text("v1\n")
    git(code, "add", ".")
    git(code, "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qm", "v1")
    site = root / "site"
    _install_probe(site, "1.0")
    spec = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    spec["training"].update(max_steps=60, eval_every=30)
    spec["checkpoint"]["every_steps"] = 30
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    # The runs' lineage is read on the server: its processes see the code directory and the packages.
    with running_platform(root / "home", TP_CODE_DIR=str(code), PYTHONPATH=str(site)) as platform:
        yield {"root": root, "code": code, "site": site, "platform": platform}


def _install_probe(site: Path, version: str) -> None:
    """A distribution that importlib.metadata sees as installed: what a `pip install` leaves behind."""
    for old in site.glob("tp_probe-*.dist-info"):
        (old / "METADATA").unlink()
        old.rmdir()
    info = site / f"tp_probe-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tp-probe\nVersion: {version}\n")


def tp(world, *args: str) -> tuple[int, dict, str]:
    proc = world["platform"].tp(*args)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else {}, proc.stderr


@pytest.fixture(scope="module")
def original(world) -> dict:
    code, summary, err = tp(world, "train", str(world["root"] / "spec.yaml"), "--json")
    assert code == 0, err[-3000:] + server_logs(world["root"] / "home")
    return summary


def test_reproduction_of_an_unchanged_run_is_exact(world, original):
    code, report, err = tp(world, "reproduce", original["run_id"], "--json")
    assert code == 0, err[-3000:]
    assert report["reproduced_exactly"] is True
    assert report["weights_equal"] is True
    assert report["differences"] == []
    assert "reproduced exactly" in report["summary"]


def test_a_new_commit_and_a_package_upgrade_are_reported_exactly(world, original):
    (world["code"] / "train_notes.txt").write_text("v2\n")
    git(world["code"], "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qam", "v2")
    _install_probe(world["site"], "2.0")
    new_commit = git(world["code"], "rev-parse", "HEAD").strip()

    code, report, err = tp(world, "reproduce", original["run_id"], "--json")
    assert code == 0, err[-3000:]  # the weights still agree, so the check passes ...
    assert report["weights_equal"] is True
    assert report["reproduced_exactly"] is False  # ... but not from the same lineage
    assert report["differences"] == [
        f"code commit: {git(world['code'], 'rev-parse', 'HEAD~1').strip()} -> {new_commit}",
        "package tp-probe: 1.0 -> 2.0",
    ]


def test_a_missing_snapshot_is_the_reason_it_cannot_be_reproduced(world, original):
    manifest = world["root"] / "home" / "snapshots" / f"{original['snapshot_id']}.json"
    saved = manifest.read_bytes()
    manifest.unlink()
    try:
        code, report, err = tp(world, "reproduce", original["run_id"], "--json")
    finally:
        manifest.write_bytes(saved)
    assert code == 2
    assert "cannot reproduce" in err and original["snapshot_id"] in err
    assert report["status"] == "REFUSED"


def test_an_unknown_run_is_refused(world):
    code, report, err = tp(world, "reproduce", "no-such-run", "--json")
    assert code == 2 and "no run 'no-such-run'" in err and report["status"] == "REFUSED"
