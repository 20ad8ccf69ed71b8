"""The shared warm standby (launch/standby_server.py, SharedStandby): every run's first attempt forked warm, each run's
ranks kept to their own, and gone with its owner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.fixtures.worker import standby_pid, wait_until
from training_platform.launch import standby
from training_platform.launch.frameworks import PRELOAD_ENV
from training_platform.telemetry.samplers import local_training_processes

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A shared standby for a platform home, owned by a stand-in server process, loaded."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "TP_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env.pop("OMP_NUM_THREADS", None)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # set by DeepSpeed's import, if this process imported it
    owner = subprocess.Popen(["sleep", "600"])
    # A job's credentials: the standby is started with none of them, though the launcher hands it the job's env.
    standby.spawn_shared(home, owner.pid, {**env, "AWS_SECRET_ACCESS_KEY": "not-for-the-standby"})
    log = home / standby.SHARED_LOG_FILE
    wait_until(lambda: "ready in" in log.read_text(), what="shared standby ready", timeout=120)
    agents: list[subprocess.Popen] = []
    yield home, owner, env, agents
    for process in [owner, *agents]:  # a test that failed midway leaves them running
        process.kill()


def _standby_pid(home: Path) -> int:
    return standby_pid(home / standby.SHARED_LOG_FILE)


def _agent(shared, run: str, *module_args: str, env_extra: dict | None = None) -> tuple[subprocess.Popen, Path]:
    home, _, env, agents = shared
    run_dir = home / "runs" / run
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "training_platform.launch.agent", "--nproc-per-node=2",
               "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", f"--rdzv-id={run}", "-m", "agent_probe",
               *module_args]
    env = {**env, standby.SHARED_ENV: "1", "PROBE_DIR": str(run_dir), "PROBE_SECRET": run, **(env_extra or {})}
    out = open(run_dir / "agent.log", "w")  # noqa: SIM115 - the agent's stdout, as the launcher's log file
    agents.append(subprocess.Popen(command, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT))
    return agents[-1], run_dir


def _ranks(run_dir: Path) -> list[dict]:
    wait_until(lambda: all((run_dir / f"rank{r}.json").is_file() for r in (0, 1)), what="both ranks started")
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_runs_start_as_its_forks_each_as_its_own_job(shared, monkeypatch):
    home = shared[0]
    first, first_dir = _agent(shared, "first", "--wait")
    second, second_dir = _agent(shared, "second", "--greeting", "hello")
    assert second.wait(timeout=120) == 0, (second_dir / "agent.log").read_text()[-3000:]
    first_ranks = _ranks(first_dir)
    for run_dir, seen_ranks in ((first_dir, first_ranks), (second_dir, _ranks(second_dir))):
        for seen in seen_ranks:
            assert seen["ppid"] == _standby_pid(home)  # forked warm, not started cold
            # As a cold rank of this run would be: its directory, `python -m`'s path entry, its job's environment.
            assert seen["cwd"] == seen["path0"] == str(run_dir) and seen["has_secret"]
            assert seen["threads"] == 1 and not seen["cuda_initialized"]
            assert seen["frozen_objects"] > 100_000  # what the standby loaded is frozen (heap_freeze.py)
            assert seen["sigterm_default"] or seen["argv"] == ["--wait"]  # a waiting probe handles SIGTERM itself
    assert "probe rank 0 on stdout" in (second_dir / "agent.log").read_text()
    # The node's telemetry samples this run's two ranks: not its agent, not another run's ranks.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "first")
    sampled = local_training_processes(psutil.Process(first_ranks[0]["pid"]))
    assert sorted(p.pid for p in sampled) == sorted(seen["pid"] for seen in first_ranks)
    first.kill()  # a SIGKILLed job takes its forks along
    _, alive = psutil.wait_procs([psutil.Process(seen["pid"]) for seen in first_ranks], timeout=30)
    assert not alive


def test_it_holds_no_job_credentials_and_serves_only_its_import_environment(shared):
    home = shared[0]
    assert "AWS_SECRET_ACCESS_KEY" not in psutil.Process(_standby_pid(home)).environ()
    # A job that imports torch with other settings starts cold, as it would without a standby.
    agent, run_dir = _agent(shared, "other-settings", env_extra={"TORCH_SHOW_CPP_STACKTRACES": "1"})
    assert agent.wait(timeout=120) == 0, (run_dir / "agent.log").read_text()[-3000:]
    assert all(seen["ppid"] != _standby_pid(home) for seen in _ranks(run_dir))


def test_a_run_using_deepspeed_is_forked_by_a_standby_that_loaded_it_once_that_one_is_up(shared):
    home, owner, env, _ = shared
    uses_deepspeed = {PRELOAD_ENV: "deepspeed"}
    # None loaded it yet: the standby every run uses forks its ranks, which import DeepSpeed themselves.
    agent, run_dir = _agent(shared, "deepspeed-first", env_extra=uses_deepspeed)
    assert agent.wait(timeout=120) == 0, (run_dir / "agent.log").read_text()[-3000:]
    assert [(seen["ppid"], seen["frameworks"]) for seen in _ranks(run_dir)] == [(_standby_pid(home), [])] * 2
    # The launcher starts one that loads it as well (launch/local.py); from then on the run's ranks are its forks.
    standby.spawn_shared(home, owner.pid, {**env, **uses_deepspeed})
    log = home / standby.SHARED_LOG_FILE
    wait_until(lambda: "(with deepspeed)" in log.read_text(), what="the DeepSpeed standby ready", timeout=120)
    loaded = standby_pid(log, "(with deepspeed)")
    agent, run_dir = _agent(shared, "deepspeed-warm", env_extra=uses_deepspeed)
    assert agent.wait(timeout=120) == 0, (run_dir / "agent.log").read_text()[-3000:]
    for seen in _ranks(run_dir):
        assert (seen["ppid"], seen["frameworks"]) == (loaded, ["deepspeed"])
        # What DeepSpeed's import sets, a warm rank has as a rank that imported it would.
        assert seen["nvml_based_cuda_check"] == "1"
    # A run that does not use it keeps to the standby that never loaded it.
    agent, run_dir = _agent(shared, "plain-after")
    assert agent.wait(timeout=120) == 0, (run_dir / "agent.log").read_text()[-3000:]
    assert [(seen["ppid"], seen["frameworks"]) for seen in _ranks(run_dir)] == [(_standby_pid(home), [])] * 2


@pytest.mark.parametrize("warm", [True, False])
def test_a_process_that_is_no_rank_is_its_fork_and_without_a_standby_runs_cold(shared, warm):
    """`standby module MODULE ARGS` (a script's evaluation): forked with its arguments, output and exit status."""
    home, _, env, _ = shared
    run_dir = home / "runs" / f"module-{'warm' if warm else 'cold'}"
    run_dir.mkdir(parents=True)
    env = {**env, "PROBE_DIR": str(run_dir), "RANK": "0", "WORLD_SIZE": "1"}
    env |= {standby.SHARED_ENV: "1"} if warm else {}
    command = [sys.executable, "-m", "training_platform.launch.standby", standby.MODULE_ROLE, "agent_probe"]
    done = subprocess.run([*command, "--greeting", "hi"], cwd=run_dir, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "probe rank 0 on stdout" in done.stdout, done.stderr[-3000:]
    seen = json.loads((run_dir / "rank0.json").read_text())
    assert seen["argv"] == ["--greeting", "hi"] and seen["cwd"] == str(run_dir)
    assert seen["ppid"] == (_standby_pid(home) if warm else os.getpid())  # cold: it ran in the process started
    assert subprocess.run([*command, "--exit-3"], cwd=run_dir, env=env, timeout=120).returncode == 3


def test_it_leaves_with_its_owner(shared):
    home, owner, env, _ = shared
    pid = _standby_pid(home)
    owner.kill()
    owner.wait()
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
               what="shared standby gone")
    assert not standby.bound(standby.shared_address(env))
    assert (home / standby.SHARED_LOG_FILE).read_text().rstrip().endswith("left")
