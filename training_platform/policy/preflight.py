"""Checks a spec against the environment before anything launches: refuse early, lose nothing.

Every entry point (the CLI, the training_run asset, hence the UI, sensors and sweeps) calls `preflight`
and launches the spec it returns.
"""

from __future__ import annotations

import ast
import importlib.util
import uuid
from pathlib import Path
from typing import Any

from training_platform.datasets import load_manifest
from training_platform.errors import SnapshotError, SpecError
from training_platform.paths import PlatformHome
from training_platform.policy.team_policy import resolve_team
from training_platform.redaction import Redactor
from training_platform.spec import TEMPLATE_METRICS, TrainSpec
from training_platform.train.spot_notice import check_notice_url


def check_snapshot(spec: TrainSpec, home: PlatformHome) -> None:
    if spec.dataset.snapshot_id is None:
        return
    try:
        load_manifest(home.snapshots, spec.dataset.snapshot_id)
    except SnapshotError as exc:
        raise SpecError(f"dataset.snapshot_id: {exc}") from None


def check_own_files(spec: TrainSpec) -> None:
    """A spec that snapshots your own files: they exist and have the declared columns. Called where a spec is
    submitted (`tp train`, `tp sweep`), not by the training asset: a built snapshot trains without its files."""
    if not spec.dataset.is_file_source or spec.dataset.source is None or spec.dataset.columns is None:
        return
    from training_platform.datasets.files import FileSource, check_source
    from training_platform.spec.file_source import FileSplit

    source = FileSource(uri=spec.dataset.source, columns=spec.dataset.columns, split=spec.dataset.split or FileSplit())
    try:
        check_source(source)
    except SnapshotError as exc:
        raise SpecError(str(exc)) from None


def check_store_writable(store_uri: str) -> None:
    """A local checkpoint directory must be creatable and writable (S3 is checked by its tier)."""
    if store_uri.startswith("s3://"):
        return
    path = Path(store_uri.removeprefix("file://")).expanduser()
    probe = path / f".tp-write-probe-{uuid.uuid4().hex}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpecError(
            f"checkpoint.store_uri: cannot write to {path} ({exc.strerror}); "
            "point it at a writable directory or fix its permissions"
        ) from None


def check_entrypoint(spec: TrainSpec) -> None:
    """The user's script must exist (and its module be importable) before anything launches."""
    entrypoint = spec.entrypoint
    if entrypoint is None:
        return
    if entrypoint.script and entrypoint.code is None and not Path(entrypoint.script).is_file():
        raise SpecError(
            f"entrypoint.script: {entrypoint.script} does not exist; give a path relative to the spec file"
        )
    if entrypoint.module and importlib.util.find_spec(entrypoint.module.split(".")[0]) is None:
        raise SpecError(
            f"entrypoint.module: cannot import {entrypoint.module!r}; install its package in the environment "
            "(pip install -e .) or use entrypoint.script"
        )


def check_evaluation(spec: TrainSpec) -> None:
    """The user's code names only metrics it can report: a metric beyond the default evaluation's must be returned
    by the function given to `session.evaluate_with`, so its name is in the code (the script, or the module's
    package). Refused here, not after the whole training run, when the evaluation would not report it."""
    entrypoint = spec.entrypoint
    if spec.evaluation is None or entrypoint is None:
        return
    own = [name for name in spec.evaluation.metrics if name not in TEMPLATE_METRICS]
    if not own:
        return
    if entrypoint.code is not None:
        where, sources = entrypoint.script, {entrypoint.script: entrypoint.code.text}
    elif entrypoint.module is not None:
        where, sources = f"module {entrypoint.module}", _package_sources(entrypoint.module)
    else:
        return  # a script not read yet (a spec parsed by hand): its evaluation says what it lacks
    if not sources:
        return  # a compiled module: nothing to read here
    names: set[str] = set()
    calls = False
    for path, text in sources.items():
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            raise SpecError(f"entrypoint: {path} is not valid Python (line {exc.lineno}: {exc.msg}); fix it") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
            calls = calls or (isinstance(node, ast.Attribute) and node.attr == "evaluate_with")
    unreported = [name for name in own if not calls or name not in names]
    if unreported:
        target = "its function given to session.evaluate_with" if calls else "session.evaluate_with (it never calls it)"
        raise SpecError(
            f"evaluation.metrics: {where} never reports {', '.join(unreported)}: the default evaluation "
            f"reports {' and '.join(TEMPLATE_METRICS)}; return {', '.join(unreported)} from {target}, or remove "
            "them from evaluation.metrics"
        )


def _package_sources(module: str) -> dict[str, str]:
    """The Python files of the module's top-level package (or the module's own file), found without importing
    it: importing would run the user's code in the platform's process."""
    found = importlib.util.find_spec(module.split(".")[0])
    if found is None or found.origin is None:
        return {}  # check_entrypoint names a module that cannot be found
    if found.submodule_search_locations:
        paths = sorted(path for folder in found.submodule_search_locations for path in Path(folder).rglob("*.py"))
    else:
        paths = [Path(found.origin)] if found.origin.endswith(".py") else []
    return {str(path): path.read_text(errors="replace") for path in paths}


def check_no_secrets(spec: TrainSpec) -> None:
    """A spec is written to run files, ConfigMaps, Dagster config and MLflow: a secret in it is refused."""
    redactor = Redactor()

    def walk(field: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{field}.{key}" if field else key, value)
        elif isinstance(node, list):
            items = [str(item) for item in node]
            masked = redactor.args(items)
            for index, (item, hidden) in enumerate(zip(items, masked, strict=True)):
                if item != hidden:
                    kind = redactor.first_secret(item) or "the value of a secret-named flag"
                    _refuse(f"{field}[{index}]", kind)
        elif isinstance(node, str) and (kind := redactor.first_secret(node)):
            _refuse(field, kind)

    # The script's text is code, not a setting: `token=os.environ["HF_TOKEN"]` reads a secret, it holds none.
    walk("", spec.model_dump(mode="json", exclude={"entrypoint": {"code": {"text"}}}))


def _refuse(field: str, kind: str) -> None:
    raise SpecError(
        f"{field}: holds a secret ({kind}); do not put secrets in a spec: let the job read it from its "
        "environment (TP_JOB_ENV names the variables local and Slurm jobs get; on Kubernetes a Secret in "
        "kubernetes.secret_refs)"
    )


def check_strategy_installed(spec: TrainSpec) -> None:
    """DeepSpeed is an optional extra: a local run must find it here (other backends: in their image)."""
    if spec.strategy == "deepspeed" and spec.backend == "local" and importlib.util.find_spec("deepspeed") is None:
        raise SpecError(
            "strategy: deepspeed is not installed in this environment; pip install 'training-platform[deepspeed]' "
            "or use strategy: fsdp"
        )


def preflight(spec: TrainSpec, home: PlatformHome, store_uri: str, sweep_trial: bool = False) -> TrainSpec:
    """Refuse (SpecError) what cannot or may not run; returns the spec with its team's defaults, to launch (a
    `sweep_trial` in its team's sweep queue)."""
    check_no_secrets(spec)
    policy = spec.preemption
    if policy.notice_url and policy.notice_provider != "none":
        check_notice_url(policy.notice_provider, policy.notice_url)
    spec = resolve_team(spec, home.root, sweep_trial=sweep_trial)
    check_snapshot(spec, home)
    check_store_writable(store_uri)
    check_entrypoint(spec)
    check_evaluation(spec)
    check_strategy_installed(spec)
    return spec
