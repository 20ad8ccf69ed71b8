"""A real local run (torchrun, gloo, 2 ranks): the rendezvous and every socket of the job listen on
loopback only, read from /proc/net, and the job's environment holds none of the orchestrator's secrets."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LocalLauncher
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
HERE = Path(__file__).parent
ORCHESTRATOR_SECRETS = {
    "TP_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/webhook-secret-1",
    "DAGSTER_PG_PASSWORD": "database-secret-2",
    "GITHUB_TOKEN": "ghp_orchestrator-secret-3",
}


def _listening(pids: set[int]) -> list[str]:
    """`address:port` of every TCP socket the processes listen on, from /proc/net/tcp and tcp6."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                found.append(_address(local))
    return found


def _address(hex_address: str) -> str:
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    # /proc/net stores each 32-bit word in host (little-endian) order.
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    import ipaddress

    return f"{ipaddress.ip_address(b''.join(words))}:{int(port, 16)}"


def _process_group(leader: int) -> set[int]:
    group = os.getpgid(leader)
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    pids.add(int(entry.name))
            except ProcessLookupError:
                continue
    return pids


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory) -> tuple[list[str], list[dict[str, str]]]:
    """One real run of `env_probe` with secrets in this process's environment: what it listened on, its ranks' env."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in ORCHESTRATOR_SECRETS.items():
            monkeypatch.setenv(name, value)
        return _probe(tmp_path_factory.mktemp("local-run") / "run")


def _probe(run_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    spec = parse_spec({"name": "probe", "team": "qa", "owner": "ci", "resources": {"procs_per_node": 2}})
    env = {"TP_PROBE_DIR": str(run_dir), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    launcher = LocalLauncher(visible_gpus=0)
    plan = launcher.plan(RunRequest(spec=spec, run_id="probe-1", run_dir=run_dir, env=env))
    command = [("env_probe" if part == "training_platform.train" else part) for part in plan.command]
    plan = replace(plan, command=command)
    run_dir.mkdir()
    handle = launcher.submit(plan)
    deadline = time.monotonic() + 120
    while not all((run_dir / f"ready-rank{r}").exists() for r in (0, 1)):
        assert launcher.status(handle).state is JobState.RUNNING, launcher.logs(handle)[-3000:]
        assert time.monotonic() < deadline, launcher.logs(handle)[-3000:]
        time.sleep(0.1)
    try:
        listening = _listening(_process_group(int(handle.job_id.split(":")[0])))
    finally:
        (run_dir / "stop").write_text("")
    while not launcher.status(handle).state.finished:
        assert time.monotonic() < deadline + 30
        time.sleep(0.1)
    assert launcher.status(handle).state is JobState.SUCCEEDED, launcher.logs(handle)[-3000:]
    return listening, [json.loads((run_dir / f"env-rank{rank}.json").read_text()) for rank in (0, 1)]


def test_a_local_run_listens_on_loopback_only(probed_run):
    listening, _ = probed_run
    # The agent's rendezvous store, the store it shares with the workers, gloo's own sockets.
    assert len(listening) >= 2, listening
    assert all(address.rsplit(":", 1)[0] in ("127.0.0.1", "::1") for address in listening), listening


def test_a_local_job_gets_none_of_the_orchestrators_secrets(probed_run):
    _, environments = probed_run
    for seen in environments:
        assert not set(ORCHESTRATOR_SECRETS) & set(seen)
        assert not any(secret in value for value in seen.values() for secret in ORCHESTRATOR_SECRETS.values())
        assert seen["TP_PROBE_DIR"].endswith("run") and seen["PATH"] == os.environ["PATH"]
