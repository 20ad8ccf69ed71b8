"""A spot run's warm standby (launch/standby.py): attempts it forks behave as cold ones, and it leaves."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.fixtures.worker import wait_until
from training_platform.launch import standby
from training_platform.runs.events import RunEvents
from training_platform.runs.layout import PREEMPTED_MARKER
from training_platform.telemetry.samplers import local_training_processes

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A standby for a run directory, started beside a stand-in attempt, loaded once that attempt trains."""
    run_dir = tmp_path_factory.mktemp("run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    env.pop("OMP_NUM_THREADS", None)
    attempt = subprocess.Popen(["sleep", "600"])
    standby.spawn(run_dir, attempt.pid, env)
    wait_until(lambda: standby.running(run_dir, env), what="standby bound")
    RunEvents(run_dir).append("first_step")
    log = run_dir / standby.LOG_FILE
    wait_until(lambda: "ready in" in log.read_text(), what="standby ready")
    agents: list[subprocess.Popen] = []
    yield run_dir, attempt, env, agents
    for agent in [attempt, *agents]:  # a test that failed midway leaves them running
        agent.kill()
    standby.stop(run_dir, env)


def _agent(warm, *module_args: str) -> subprocess.Popen:
    run_dir, _, env, agents = warm
    command = [sys.executable, "-m", "training_platform.launch.agent", "--nproc-per-node=2",
               "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-id=probe", "-m", "agent_probe",
               *module_args]
    env = {**env, standby.STANDBY_ENV: "1", "PROBE_DIR": str(run_dir)}
    out = open(run_dir / "agent.log", "w")  # noqa: SIM115 - the agent's stdout, as the launcher's log file
    agents.append(subprocess.Popen(command, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT))
    return agents[-1]


def _ranks(run_dir: Path) -> list[dict]:
    wait_until(lambda: all((run_dir / f"rank{r}.json").is_file() for r in (0, 1)), what="both ranks started")
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in (0, 1):
        (run_dir / f"rank{r}.json").unlink()
    return ranks


def _standby_pid(run_dir: Path) -> int:
    return int((run_dir / standby.LOG_FILE).read_text().split("standby ", 1)[1].split(":", 1)[0])


def test_the_standby_forks_the_agent_and_ranks_as_the_job_started_them(warm):
    run_dir = warm[0]
    agent = _agent(warm, "--greeting", "hello")
    assert agent.wait(timeout=120) == 0, (run_dir / "agent.log").read_text()[-3000:]
    for seen in _ranks(run_dir):
        assert seen["ppid"] == _standby_pid(run_dir)  # forked warm, not started cold
        assert seen["argv"] == ["--greeting", "hello"] and seen["world_size"] == 2
        assert seen["cwd"] == str(run_dir) and seen["start_method"] == "fork"
        assert seen["threads"] == 1 and seen["sigterm_default"] and not seen["cuda_initialized"]
    # Their stdout is the job's log, as a cold rank's would be.
    assert "probe rank 0 on stdout" in (run_dir / "agent.log").read_text()


def test_a_sigterm_reaches_the_forked_ranks_and_a_failure_keeps_its_status(warm, monkeypatch):
    run_dir = warm[0]
    agent = _agent(warm, "--wait")
    ranks = _ranks(run_dir)
    # The node's telemetry samples the two ranks, not their agent (a sibling with the same command line).
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "probe")
    sampled = local_training_processes(psutil.Process(ranks[0]["pid"]))
    assert sorted(p.pid for p in sampled) == sorted(seen["pid"] for seen in ranks)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=120) != 0  # torchrun ends a signalled job as failed, cold or warm
    for r in (0, 1):  # each rank's own SIGTERM handler ran: an emergency checkpoint would have been taken
        assert (run_dir / f"rank{r}.json.terminated").read_text() == str(int(signal.SIGTERM))
    assert not any(psutil.pid_exists(seen["pid"]) for seen in ranks)

    failing = _agent(warm, "--fail")
    assert failing.wait(timeout=120) != 0
    assert "ValueError: probe asked to fail" in (run_dir / "agent.log").read_text()
    exiting = _agent(warm, "--exit-3")
    assert exiting.wait(timeout=120) != 0
    assert re.search(r"exitcode\s*:\s*3 ", (run_dir / "agent.log").read_text())  # the rank's own status


def test_a_sigkilled_job_takes_what_the_standby_forked_with_it(warm):
    run_dir = warm[0]
    agent = _agent(warm, "--wait")
    forked = [psutil.Process(seen["pid"]) for seen in _ranks(run_dir)]
    agent.kill()
    agent.wait()
    _, alive = psutil.wait_procs(forked, timeout=30)
    assert not alive


DIES_AT_HAND_OVER = """
import json, os, pathlib, socket, sys
from training_platform.launch import standby
run_dir = pathlib.Path(sys.argv[1])
connection = socket.socket(socket.AF_UNIX)
connection.connect(standby.address(run_dir))
request = {"role": "agent", "argv": json.loads(sys.argv[2]), "env": dict(os.environ), "cwd": str(run_dir)}
standby._send(connection, request, fds=[0, 1, 2])
os._exit(0)  # gone before the standby answers, as an agent SIGKILLed at the hand-over
"""


def test_an_agent_killed_at_the_hand_over_leaves_nothing_of_its_job(warm):
    run_dir, _, env, _ = warm
    log = run_dir / standby.LOG_FILE
    before = log.read_text().count("forked agent")
    argv = ["--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-id=probe",
            "-m", "agent_probe", "--wait"]
    env = {**env, standby.STANDBY_ENV: "1", "PROBE_DIR": str(run_dir)}
    subprocess.run([sys.executable, "-c", DIES_AT_HAND_OVER, str(run_dir), json.dumps(argv)], env=env, check=True,
                   timeout=60)
    wait_until(lambda: log.read_text().count("forked agent") > before, what="the standby forked the agent")
    forked = int(log.read_text().rsplit("forked agent ", 1)[1].split()[0])

    def group_gone() -> bool:
        try:
            os.killpg(forked, 0)
        except ProcessLookupError:
            return True
        return False

    # Nothing of the job lives on: the agent it forked, nor any rank that agent might have started.
    wait_until(group_gone, 10, "the agent forked for a requester that was gone")
    assert not any((run_dir / f"rank{r}.json").exists() for r in (0, 1))


AS_ANOTHER_USER = """
import contextlib, pathlib, socket, sys
from training_platform.launch import standby
run_dir = pathlib.Path(sys.argv[1])
# As a requester: it does not hand its job to a standby of another user.
assert standby.run_in_standby(standby.address(run_dir), "worker", ["agent_probe"]) is None
# As an intruder: the standby refuses to act on its request.
intruder = socket.socket(socket.AF_UNIX)
intruder.connect(standby.address(run_dir))
with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before it finished asking
    standby._send(intruder, {"role": "stop"}, fds=[])
"""


@pytest.mark.skipif(os.getuid() != 0, reason="acting as another user needs root")
def test_the_standby_and_its_requesters_deal_only_with_their_own_user(warm):
    run_dir, _, env, _ = warm
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    subprocess.run([*nobody, sys.executable, "-c", AS_ANOTHER_USER, str(run_dir)], env=env, check=True, timeout=60)
    log = run_dir / standby.LOG_FILE
    wait_until(lambda: "refused a request from uid 65534" in log.read_text(), what="request refused")
    agent = _agent(warm, "--greeting", "still here")
    assert agent.wait(timeout=120) == 0
    assert all(seen["ppid"] == _standby_pid(run_dir) for seen in _ranks(run_dir))


def test_it_waits_for_a_preempted_runs_requeue_and_leaves_when_stopped(warm):
    run_dir, attempt, env, _ = warm
    log = run_dir / standby.LOG_FILE
    (run_dir / PREEMPTED_MARKER).write_text("{}")
    attempt.kill()  # the attempt that started it ends preempted: it stays for the requeue
    wait_until(lambda: "waiting up to" in log.read_text(), what="standby waiting for the requeue")
    assert standby.running(run_dir, env)
    standby.stop(run_dir)  # with this process's environment: its address differs, the stop file reaches it
    wait_until(lambda: not standby.running(run_dir, env), what="standby gone")
    assert log.read_text().rstrip().endswith("left")
