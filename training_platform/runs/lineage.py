"""The lineage key: what a run was made from, so it can be found and built again."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from training_platform.spec import TrainSpec


@dataclass(frozen=True)
class CodeVersion:
    commit: str
    dirty: bool


def code_dir() -> Path:
    """The repository whose commit identifies "the code": $TP_CODE_DIR, else this project."""
    return Path(os.environ.get("TP_CODE_DIR") or Path(__file__).resolve().parent.parent)


def code_version(repo: Path | None = None) -> CodeVersion:
    """The git commit of the code (and whether the tree had uncommitted changes)."""
    cwd = repo or code_dir()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return CodeVersion(commit="unknown", dirty=True)
    return CodeVersion(commit=commit, dirty=dirty)


def environment_lock() -> list[str]:
    """Installed distributions as sorted `name==version` lines."""
    return list(_environment_lock(_import_path_stamps()))


def _import_path_stamps() -> tuple[tuple[str, int], ...]:
    """Each import directory, as an absolute path, with its modification time: installing or removing a distribution
    changes it. Absolute, because a process may name one directory two ways: the code server's fork server reads the
    lock for its runs with the working directory as "" on its path, and each run, its fork, has it by name."""
    stamps = []
    for entry in sys.path:
        directory = os.path.abspath(entry)  # "" is the working directory
        try:
            stamps.append((directory, os.stat(directory).st_mtime_ns))
        except OSError:
            continue
    return tuple(stamps)


@functools.lru_cache(maxsize=4)
def _environment_lock(stamps: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    # Reading every distribution's metadata takes ~0.2 s of CPU, and a pipeline asks three times.
    lines = {f"{d.metadata['Name'].lower()}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]}
    return tuple(sorted(lines))


def environment_lock_hash() -> str:
    return hashlib.sha256("\n".join(environment_lock()).encode()).hexdigest()


@dataclass(frozen=True)
class LineageKey:
    snapshot_id: str
    spec_hash: str
    code_commit: str
    code_dirty: bool
    environment_lock_hash: str
    seed: int
    backend: str
    script_sha256: str | None = None  # the user's entrypoint script, when the run has one

    @classmethod
    def of(cls, spec: TrainSpec) -> LineageKey:
        code = code_version()
        return cls(
            snapshot_id=spec.dataset.snapshot_id or "",
            spec_hash=spec.spec_hash(),
            code_commit=code.commit,
            code_dirty=code.dirty,
            environment_lock_hash=environment_lock_hash(),
            seed=spec.training.seed,
            backend=spec.backend,
            script_sha256=_script_sha256(spec),
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _script_sha256(spec: TrainSpec) -> str | None:
    """The hash of the script the run's jobs run: the text shipped with the spec, else the file's."""
    entrypoint = spec.entrypoint
    if entrypoint is None or entrypoint.script is None:
        return None
    if entrypoint.code is not None:
        return entrypoint.code.sha256
    return hashlib.sha256(Path(entrypoint.script).read_bytes()).hexdigest()
