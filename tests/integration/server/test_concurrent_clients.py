"""Three `tp train` of one spec started at the same moment against a fresh platform home, as from three terminals.

No server runs yet: the three clients race to start it (one does, the others use it), to build the day's
snapshot and to train. All three runs succeed, distinct, with bitwise equal weights and three model versions.
"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import Platform, free_port, platform_env, server_logs
from tests.integration.server.runs import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def test_three_clients_at_once_all_succeed_with_equal_weights(tmp_path):
    home = tmp_path / "home"
    platform = Platform(home, platform_env(home, TP_SERVER_PORT=str(free_port())))
    spec = write_spec(tmp_path, "three-at-once", training={"max_steps": 100, "eval_every": 50})
    clients = [platform.spawn("train", str(spec), "--json", log=tmp_path / f"tp{i}.log") for i in range(3)]
    try:
        codes = [client.wait(600) for client in clients]
        logs = [(tmp_path / f"tp{i}.log").read_text() for i in range(3)]
        assert codes == [0, 0, 0], "\n".join(log[-2000:] for log in logs) + server_logs(home)
        summaries = [last_json_line(log) for log in logs]
    finally:
        assert platform.tp("server", "stop", "--force").returncode == 0
    assert len({s["run_id"] for s in summaries}) == 3
    assert all(s["status"] == "SUCCEEDED" for s in summaries)
    assert len({s["final_weights_sha256"] for s in summaries}) == 1  # same spec, seed and snapshot on CPU
    assert sorted(s["model_version"] for s in summaries) == ["1", "2", "3"]
    versions = MlflowClient(tracking_uri=summaries[0]["tracking_uri"]).search_model_versions("name='three-at-once'")
    assert len(versions) == 3
    assert sum("starting the platform server" in log for log in logs) == 1  # one client started it


def last_json_line(log: str) -> dict:
    """The summary `tp train --json` ended with (its stdout and stderr share the log)."""
    lines = [line for line in log.strip().splitlines() if line.startswith("{")]
    assert lines, log[-2000:]
    return json.loads(lines[-1])
