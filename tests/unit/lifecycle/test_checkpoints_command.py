"""`tp checkpoints RUN`, as a user runs it: each checkpoint's figures, pins and whether it restores, the manifests
that do not parse, and the step `tp resume` would continue from; the run's own store found from its record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from tests.fixtures.platform import TP, last_json, platform_env
from training_platform.checkpoints import open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key, pack_key

RUN = "ckpt-listing"


def tp(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TP, *args], env=platform_env(home), capture_output=True, text=True, timeout=120)


def save_three(store_dir: Path) -> None:
    store = open_store(store_dir)
    for step in (1, 2, 3):  # the tensor's bytes differ at each step (the skeleton's are shared)
        store.save(RUN, step, {"w": torch.full((512,), float(step))}, {"loss": 1.0 / step})
    store.pin(RUN, 1, "registered_model:digits/1")
    for ref in store.list(RUN)[-1].tensors[0].chunks:
        store.storage.delete(pack_key(ref.pack) if ref.pack else chunk_key(ref.digest))
    store.storage.put(manifest_key(RUN, 4), b'{"torn')


def test_lists_each_checkpoint_and_the_step_a_resume_continues_from(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_three(home / "checkpoints")
    listing = last_json(tp(home, "checkpoints", RUN, "--json"))
    rows = listing["checkpoints"]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["restores"] for row in rows] == [True, True, False]  # step 3's bytes are gone
    assert listing["resumes_from"] == 2
    assert rows[0]["pins"] == ["registered_model:digits/1"] and rows[1]["pins"] == []
    assert rows[1]["metrics"] == {"loss": 0.5} and rows[1]["bytes"] >= 512 * 4
    assert rows[1]["bytes_written"] == 512 * 4  # its tensor only: the skeleton is step 1's
    assert list(listing["unreadable"]) == ["4"] and "torn or edited" in listing["unreadable"]["4"]

    shown = tp(home, "checkpoints", RUN)
    assert shown.returncode == 0, shown.stderr
    assert f"`tp resume {RUN}` continues from step 2" in shown.stderr
    assert "registered_model:digits/1" in shown.stderr and "step 4 does not restore" in shown.stderr


def test_reads_the_store_the_runs_attempt_recorded(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "team-store"
    open_store(elsewhere).save(RUN, 7, {"w": torch.ones(8)})
    record = home / "runs" / RUN / "record.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"store_uri": str(elsewhere)}))
    listing = last_json(tp(home, "checkpoints", RUN, "--json"))
    assert listing["store"] == str(elsewhere) and listing["resumes_from"] == 7
    assert last_json(tp(home, "checkpoints", RUN, "--json", "--store", str(home / "checkpoints")))["checkpoints"] == []


def test_a_run_without_checkpoints_and_a_bad_run_id_are_told_apart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    none = tp(home, "checkpoints", "never-ran")
    assert none.returncode == 0 and "run never-ran has no checkpoints in" in none.stderr
    bad = tp(home, "checkpoints", "../other-team")
    assert bad.returncode == 2 and "run id '../other-team' is not allowed" in bad.stderr
