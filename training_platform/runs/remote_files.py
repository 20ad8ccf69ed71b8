"""A run's files through object storage, for jobs that share no disk with the Dagster side (Kubernetes pods
without a shared home).

The worker's main rank pushes what it writes into its run directory to `TP_RUN_STORE_URI` (`s3://bucket/runs`,
or a directory); the training asset pulls it into its own copy of the run directory, where every reader already
looks. Each pushing process (a pod's main rank, one per attempt and per requeue, each starting from an empty
directory) writes under keys of its own, `<run>/<dagster run>/<writer>/<file>`, `<writer>` sortable by its start:

- Logs that only grow are pulled by what they grew since the last pull, whole lines only, appended to the local
  file: the event log from every writer of the run, oldest first (a resumed run's history stays whole); the
  Pipes messages only from the writers of the Dagster run pulling them (its Pipes session reads them).
- Files written whole (the result, the preemption and pruning markers, the telemetry) replace the local copy
  atomically with the newest version the Dagster run's own writers pushed, when it changed.

Nothing here is unpickled: every file is JSON, read by the code that reads it on a shared disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from training_platform.checkpoints.backends import open_storage
from training_platform.checkpoints.storage import Storage
from training_platform.errors import CheckpointError
from training_platform.identifiers import RUN_ID, check_run_id
from training_platform.paths import RUN_STORE_ENV
from training_platform.runs.layout import EVENTS_FILE, PREEMPTED_MARKER, PRUNED_MARKER, RESULT_FILE, TELEMETRY_FILE
from training_platform.state.documents import file_lock

PIPES_MESSAGES_FILE = "pipes-messages.jsonl"
GROWING = (EVENTS_FILE, PIPES_MESSAGES_FILE)
WHOLE = (RESULT_FILE, PREEMPTED_MARKER, PRUNED_MARKER, TELEMETRY_FILE)
PULLED_STATE = ".pulled.json"  # in the local run dir: how far each growing log was pulled, what each file was
PULL_LOCK = ".pull.lock"  # two processes pulling one run would append the same lines twice
PUSH_SECONDS = 2.0
ATTEMPT_ENV = "TP_RUN_ATTEMPT"  # the Dagster run that launched the job: its Pipes session's messages
_PART = re.compile(RUN_ID)  # attempts and writers are named like run ids


def run_store_from_env() -> Storage | None:
    uri = os.environ.get(RUN_STORE_ENV)
    return open_storage(uri) if uri else None


def _part(value: str, what: str) -> str:
    if not _PART.fullmatch(value) or ".." in value:
        raise CheckpointError(f"{what} {value!r} cannot name a run store key; use letters, digits, '.', '_', '-'")
    return value


def new_writer() -> str:
    """A pushing process's own key part: its start time first, so writers sort in the order they started."""
    return f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class RunFilesPusher:
    """Pushes the run's files that changed since the last push; `start()` repeats it in the background."""

    storage: Storage
    run_id: str
    run_dir: Path
    attempt: str
    writer: str = field(default_factory=new_writer)
    pushed: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (size, mtime_ns) pushed
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._prefix = f"{check_run_id(self.run_id)}/{_part(self.attempt, 'attempt')}/{_part(self.writer, 'writer')}/"

    def push(self) -> list[str]:
        """Upload each file whose size or modification time changed; the names uploaded."""
        sent = []
        with self._lock:  # the background pushes and the last one never upload the same file at once
            for name in (*GROWING, *WHOLE):
                path = self.run_dir / name
                try:
                    stat = path.stat()
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                stamp = (stat.st_size, stat.st_mtime_ns)
                if self.pushed.get(name) == stamp:
                    continue
                self.storage.put(self._prefix + name, data, sync_parent=False)
                self.pushed[name] = stamp
                sent.append(name)
        return sent

    def start(self, seconds: float = PUSH_SECONDS) -> RunFilesPusher:
        def loop() -> None:
            while not self._stop.wait(seconds):
                try:
                    self.push()
                except Exception:  # noqa: BLE001  the store down for a moment: the next push sends it all
                    continue

        self._thread = threading.Thread(target=loop, name="run-files-pusher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the background pushes and push what changed since the last one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.push()


class RunFilesPuller:
    """The Dagster side's pull of one run, called at each poll of its job: a store down for a moment is asked
    again at the next poll; the last pull (`final=True`, once the job ended) must succeed."""

    def __init__(self, storage: Storage | None, run_id: str, run_dir: Path, attempt: str):
        self.storage, self.run_id, self.run_dir, self.attempt = storage, run_id, run_dir, attempt

    def __call__(self, final: bool = False) -> list[str]:
        if self.storage is None:  # a shared disk: the job wrote into this very run directory
            return []
        try:
            return pull(self.storage, self.run_id, self.run_dir, self.attempt, final=final)
        except CheckpointError:
            if final:
                raise
            return []


def pull(storage: Storage, run_id: str, run_dir: Path, attempt: str, *, final: bool = False) -> list[str]:
    """Bring the run's pushed files into `run_dir` (Pipes messages: only `attempt`'s); the names that changed.
    One listing finds what changed; `final` also reads the whole files again (the store's times may not tell
    two pushes within a second apart)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(run_dir / PULL_LOCK):
        return _pull(storage, run_id, run_dir, attempt, final)


def _pull(storage: Storage, run_id: str, run_dir: Path, attempt: str, final: bool) -> list[str]:
    state_path = run_dir / PULLED_STATE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    before = json.dumps(state, sort_keys=True)
    prefix = f"{check_run_id(run_id)}/"
    pushed = []  # (writer, attempt, name, info), oldest writer first
    for info in storage.list_info(prefix):
        parts = info.key.removeprefix(prefix).split("/")
        if len(parts) == 3 and parts[2] in (*GROWING, *WHOLE):
            pushed.append((parts[1], parts[0], parts[2], info))
    pushed.sort(key=lambda item: item[0])
    changed: set[str] = set()
    for writer, pushed_by, name, info in pushed:
        if name not in GROWING or (name == PIPES_MESSAGES_FILE and pushed_by != attempt):
            continue
        where = f"{pushed_by}/{writer}/{name}"
        offset = state.get(where, 0)
        if info.size <= offset:
            continue
        grown = storage.get(prefix + where)[offset:]
        whole_lines = grown[: grown.rfind(b"\n") + 1]  # a line still being written waits for the next pull
        if whole_lines:
            _append(run_dir / name, whole_lines)
            state[where] = offset + len(whole_lines)
            changed.add(name)
    # Whole files are this Dagster run's, its newest writer's (a requeued pod's): an earlier run's result or
    # marker must not pass for this one's, as `RunRequest.write_spec` removes them on a shared disk.
    newest = {name: (by, writer, info) for writer, by, name, info in pushed if name in WHOLE and by == attempt}
    for name, (pushed_by, writer, info) in newest.items():
        seen = [pushed_by, writer, info.size, info.modified]
        if not final and state.get(f"{name}:listed") == seen:
            continue
        data = storage.get(f"{prefix}{pushed_by}/{writer}/{name}")
        digest = hashlib.sha256(data).hexdigest()
        state[f"{name}:listed"] = seen
        if state.get(name) != digest:
            staged = run_dir / f".{name}.pulling"
            staged.write_bytes(data)
            os.replace(staged, run_dir / name)
            state[name] = digest
            changed.add(name)
    if json.dumps(state, sort_keys=True) != before:
        staged = run_dir / f"{PULLED_STATE}.pulling"
        staged.write_text(json.dumps(state))
        os.replace(staged, state_path)
    return sorted(changed)


def _append(path: Path, data: bytes) -> None:
    # One write() with O_APPEND, as RunEvents appends: the Dagster side's own lines never land inside these.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
