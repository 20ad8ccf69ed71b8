"""Helpers for tests that drive the platform server through `tp`: specs, run states, a run's processes."""

from __future__ import annotations

from pathlib import Path

import psutil
import yaml

from tests.fixtures.platform import ROOT, TP_POLL_S, Platform, last_json
from tests.fixtures.worker import wait_until
from training_platform.runs.events import RunEvents

PACED_SCRIPT = ROOT / "tests" / "fixtures" / "paced_train.py"
"""A script whose steps take wall time, not CPU (its docstring): for a run that must last while a test acts on it."""


def paced_entrypoint(pace: Path, step_seconds: float = 0.005) -> dict:
    """A spec's entrypoint of PACED_SCRIPT at STEP_SECONDS a step while `pace` exists, at full speed once it is
    gone."""
    return {"script": str(PACED_SCRIPT), "args": ["--step-seconds", str(step_seconds), "--pace-file", str(pace)]}


def write_spec(directory: Path, name: str, team: str = "ml-platform", **changes) -> Path:
    """examples/digits.yaml, renamed (its own model in the registry), with `changes` merged per section."""
    spec = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    spec |= {"name": name, "team": team}
    for section, values in changes.items():
        spec[section] = {**spec.get(section, {}), **values} if isinstance(values, dict) else values
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_sweep(directory: Path, name: str, max_trials: int, seed: int, checkpoint: dict | None = None,
                **training) -> Path:
    """A random search over the example's learning rate (`training` changed, one process per trial, no pruning),
    two trials at a time."""
    base = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text()) | {"name": f"{name}-digits"}
    base["training"].update(training)
    base["resources"]["procs_per_node"] = 1
    if checkpoint is not None:
        base["checkpoint"] = checkpoint
    sweep = {
        "name": name,
        "base": base,
        "search_space": {"training.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
        "sampler": {"type": "random", "seed": seed},
        "pruner": {"type": "none"},
        "limits": {"max_trials": max_trials, "parallel_trials": 2},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def detach(platform: Platform, spec: Path, *args: str) -> str:
    """`tp train SPEC --detach`: the run id."""
    proc = platform.tp("train", str(spec), "--detach", "--json", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc)["run_id"]


def run_row(platform: Platform, run_id: str) -> dict | None:
    """The run's row in `tp runs --json`."""
    proc = platform.tp("runs", "--json", "--limit", "200")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return next((row for row in last_json(proc)["runs"] if row["run_id"] == run_id), None)


ENDED = ("SUCCEEDED", "FAILED", "CANCELED")


def ended_row(platform: Platform, run_id: str, timeout: float = 600, row=None) -> dict:
    """The run's `tp runs --json` row once it ended; ROW(platform, run_id) reads it (default `run_row`).

    Asked every TP_POLL_S, and only while the run's event log is still: each `tp` is a process with about a
    second of CPU, and a run whose worker reported steps since the last look has not ended."""
    row = row or run_row
    events = RunEvents(platform.home / "runs" / run_id).path
    last_size: int | None = None  # the event log's size at the last look

    def ended() -> dict | None:
        nonlocal last_size
        size = events.stat().st_size if events.is_file() else 0
        training = last_size is not None and size != last_size
        last_size = size
        if training:
            return None
        found = row(platform, run_id)
        return found if found and found["state"] in ENDED else None

    return wait_until(ended, timeout, f"run {run_id} to end", poll=TP_POLL_S)


def step_reached(platform: Platform, run_id: str) -> int:
    """The newest step in the run's event log (written by its main rank)."""
    events = RunEvents(platform.home / "runs" / run_id).read()
    return max((e["step"] for e in events if e["kind"] in ("progress", "checkpoint")), default=0)


def processes_of(run_id: str) -> list[psutil.Process]:
    """Live processes that belong to a run: its ranks, agent, fork server and shell name it on their command line;
    an agent and ranks forked by a warm standby (launch/standby.py) work in its run directory."""
    found = []
    for process in psutil.process_iter(["cmdline", "status", "cwd"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            in_run_dir = Path(process.info["cwd"] or "/").parts[-2:] == ("runs", run_id)
        except psutil.Error:
            continue
        ours = run_id in cmdline or in_run_dir
        if ours and process.info["status"] != psutil.STATUS_ZOMBIE and process.pid != psutil.Process().pid:
            found.append(process)
    return found


def weights_of(summary: dict) -> str:
    return summary["final_weights_sha256"]
