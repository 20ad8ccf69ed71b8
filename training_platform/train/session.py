"""The worker SDK: what a training script calls to get lineage, checkpoints and preemption safety.

    with TrainingSession.start() as session:       # spec, ranks, process group, seeds, device
        data = session.dataset("train")            # data[step]: this rank's batch at that step
        restored = session.restore()               # (state, step) or None
        while step < session.spec.training.max_steps:
            ...
            step += 1
            if session.after_step(step, state, {"loss": loss}):  # reports, saves when due; True: stop now
                break
        session.finish(model, step, metrics)       # the run's result; after a stop, ends it as preempted

(`report`, `save` and `should_stop` are after_step's parts, for loops that need them one by one. That is the
whole public surface, with `spec`, `dist`, `run_id`, `run_dir` and `evaluate_with`. What the templates, strategies
and framework adapters need besides (the checkpoint store, a due save, a preemption exit, the reporter) is behind
`session.hooks`: train/hooks.py.)

The same script evaluates its run (train/evaluation_mode.py): started again with an evaluation request,
`restore()` returns the final checkpoint and `finish(model, ...)` measures the model on the test split.

Templates are written against this API, never around it.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from training_platform.checkpoints import CheckpointCadence, CheckpointManifest, CheckpointStore, open_store
from training_platform.checkpoints.interval import FIRST_AUTO_STEPS, ON_DEMAND_MTBF_SECONDS, SPOT_MTBF_SECONDS
from training_platform.launch.base import PREEMPTED_EXIT_CODE
from training_platform.paths import PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.layout import PREEMPTED_MARKER, PRUNED_MARKER, RESULT_FILE
from training_platform.spec import TrainSpec, parse_spec
from training_platform.telemetry.worker import WorkerTelemetry
from training_platform.train import distributed, spot_notice
from training_platform.train.checkpointing import RunCheckpointer, retention_policy
from training_platform.train.evaluation_mode import (
    EvaluationRequest,
    Evaluator,
    Example,
    ModelLogger,
    evaluate_model,
    exact_checkpoint,
    log_pytorch_model,
)
from training_platform.train.hooks import SessionHooks
from training_platform.train.reporting import Reporter
from training_platform.train.stopping import StopAgreement
from training_platform.train.weights import weights_sha256

if TYPE_CHECKING:
    from training_platform.train.split_data import SplitBatches, SplitStream

StateOrMaker = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
MetricsOrMaker = Mapping[str, float | torch.Tensor] | Callable[[], Mapping[str, float | torch.Tensor]]


@dataclass
class TrainingSession:
    _current: ClassVar[TrainingSession | None] = None  # the process's session, for failure reporting

    spec: TrainSpec
    run_id: str
    run_dir: Path
    _home: PlatformHome
    dist: distributed.DistInfo
    _reporter: Reporter
    _checkpoints: list[dict] = field(default_factory=list)
    _resumed_from_step: int | None = None
    _telemetry: WorkerTelemetry | None = None
    _stop_requested: bool = False
    _signal_at: float | None = None
    _stepped: bool = False
    _pruning: Any = None  # TrialPruning when this run is a sweep trial (main rank only)
    _prune_requested: bool = False
    _started: float = field(default_factory=time.monotonic)
    _evaluation: EvaluationRequest | None = None  # set when the script was started to evaluate a checkpoint
    _evaluator: Evaluator | None = None
    _example: Example | None = None  # one model input, for the registry (evaluate_with)
    _model_logger: ModelLogger | None = None  # set by a framework adapter (hooks.log_model_with)
    _stopped_at: int | None = None  # the step after_step stopped the run at
    _ended: bool = False
    _overlap_saves: bool = False  # a strategy copies saves beside its steps (hooks.overlap_saves)
    _exit_code: int = 0
    """What the worker exits with once the script returns: a run stopped for preemption exits as PREEMPTED."""

    # ----- start --------------------------------------------------------------------------
    @classmethod
    def start(cls, spec_path: str | Path | None = None, run_id: str | None = None) -> TrainingSession:
        """Read the spec the launcher wrote, join the process group, seed every RNG."""
        spec_path = Path(spec_path or os.environ["TP_SPEC"])
        spec = parse_spec(json.loads(spec_path.read_text()), source=str(spec_path))
        run_id = run_id or os.environ["TP_RUN_ID"]
        evaluation = EvaluationRequest.from_env()
        info = distributed.init_distributed()
        distributed.seed_everything(spec.training.seed)
        session = cls(
            spec=spec,
            run_id=run_id,
            run_dir=spec_path.parent,
            _home=PlatformHome.from_env(),
            dist=info,
            _reporter=Reporter(enabled=info.is_main, run_dir=spec_path.parent, run_id=run_id),
            _evaluation=evaluation,
        )
        session.hooks.take_signals()
        TrainingSession._current = session
        if evaluation is None:
            session._watch_spot_notices()
        session._telemetry = WorkerTelemetry.start(
            spec, run_id, spec_path.parent, info.rank, info.local_rank, info.local_world_size
        )
        session._event(
            "started",
            world_size=info.world_size,
            restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            requeues=int(os.environ.get("SLURM_RESTART_COUNT", 0)),
        )
        session._reporter.info(
            f"run {run_id}: {info.world_size} process(es), backend {info.backend}, device {info.device.type}"
        )
        if evaluation is None:
            session._join_sweep()
        return session

    @cached_property
    def hooks(self) -> SessionHooks:
        """For strategies, framework adapters and the template loop (train/hooks.py), not for scripts."""
        return _Hooks(self)

    @classmethod
    def running(cls) -> TrainingSession | None:
        """The process's session once started (the worker reports a script's failure through it)."""
        return cls._current

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop_requested = True
        self._signal_at = self._signal_at or time.time()

    def _watch_spot_notices(self) -> None:
        """One watcher per node (local rank 0); should_stop() shares its notice with every rank."""
        policy = self.spec.preemption
        if policy.notice_provider == "none" or self.dist.local_rank != 0:
            return

        def on_notice() -> None:
            self._event("spot_notice", provider=policy.notice_provider)
            self._on_sigterm(signal.SIGTERM, None)

        endpoint = spot_notice.endpoint_for(policy.notice_provider, policy.notice_url)
        spot_notice.SpotNoticeWatcher(endpoint, on_notice, policy.notice_poll_seconds).start()

    def _event(self, kind: str, **fields: Any) -> None:
        """Append to the run's event log (main rank only): what the preemption sensor reads."""
        if self.dist.is_main:
            RunEvents(self.run_dir).append(kind, **fields)

    @cached_property
    def _checkpoint_key(self) -> str:
        """Where this attempt's checkpoints live in the store: the run id, or a reproduction's own key."""
        if self._evaluation is not None:
            return self._evaluation.checkpoint_key
        return os.environ.get("TP_CHECKPOINT_KEY") or self.run_id

    @cached_property
    def _store(self) -> CheckpointStore:
        if self._evaluation is not None:
            return open_store(self._evaluation.store_uri)
        return open_store(self.spec.checkpoint.store_uri or self._home.checkpoints)

    @property
    def _snapshot_root(self) -> Path | str:
        return self._home.snapshots

    def dataset(
        self,
        split: str = "train",
        batch_size: int | None = None,
        *,
        stream: bool = False,
        columns: list[str] | None = None,
    ) -> SplitBatches | SplitStream:
        """One split of the run's snapshot: `data[step]` is this rank's (features, labels) batch at 0-based `step`
        (sharded across ranks, reshuffled each epoch from the spec's seed), so a resumed script reads what it
        would have read; `data.from_step(step)` iterates from there. In memory, `data.features` and
        `data.labels` hold the whole split; `stream=True` reads it shard by shard instead (a split larger than
        memory), `from_step(step, stop)` decoding ahead in worker processes. `batch_size`: default
        training.batch_size; `columns` (streamed): the feature columns to read, default all."""
        from training_platform.train.split_data import SplitBatches, SplitStream, prefetch_workers

        snapshot_id = self.spec.dataset.snapshot_id
        if snapshot_id is None:
            raise RuntimeError("the run's spec names no snapshot: start the script with `tp train`")
        sampling = {
            "batch_size": batch_size or self.spec.training.batch_size,
            "rank": self.dist.rank,
            "world_size": self.dist.world_size,
            "seed": self.spec.training.seed,
        }
        if stream:
            workers = prefetch_workers(self.spec.resources.procs_per_node)
            root = self._snapshot_root
            return SplitStream.load(root, snapshot_id, split, columns=columns, workers=workers, **sampling)
        if columns is not None:
            raise ValueError("session.dataset(columns=...) selects the columns of a streamed split: add stream=True")
        return SplitBatches.load(self._snapshot_root, snapshot_id, split, **sampling)

    def evaluate_with(self, evaluator: Evaluator, example: Example | None = None) -> None:
        """How the run's model is measured on a test split: `evaluator(model, data)` returns the metrics the
        spec's `evaluation.metrics` names (default without one: a classifier's accuracy and loss). It is
        called only when the platform evaluates a checkpoint (evaluated_model, the gate's re-evaluation).
        `example(data)`: one input as the model takes it, which the registry traces the model on (default: the
        first test row's features; a model of text or images needs one)."""
        self._evaluator, self._example = evaluator, example

    # ----- progress -----------------------------------------------------------------------
    def report(self, step: int, metrics: dict[str, float]) -> None:
        self._reporter.metrics(step, metrics)
        if self._pruning is not None and self._pruning.report(step, metrics):
            self._prune_requested = True
        self._telemetry.record(step, metrics)
        self._event("progress", step=step)

    def _data_wait(self) -> AbstractContextManager[None]:
        """Wrap each step's batch fetch: measures data wait and step time (telemetry)."""
        return self._telemetry.clock.data_wait()

    def _should_checkpoint(self, step: int) -> bool:
        """True at the steps to checkpoint, the same on every rank; call it once per step."""
        if self._evaluation is not None or not self._cadence.due(step):
            return False
        self._cadence.saved(step)
        return True

    @cached_property
    def _cadence(self) -> CheckpointCadence:
        checkpoint = self.spec.checkpoint
        default_mtbf = SPOT_MTBF_SECONDS if self.spec.resources.spot else ON_DEMAND_MTBF_SECONDS
        return CheckpointCadence(
            checkpoint.every_steps, self.spec.training.max_steps, checkpoint.mtbf_seconds or default_mtbf
        )

    def should_stop(self) -> bool:
        """True on every rank, at the same step, once any rank got a preemption notice (SIGTERM) or
        its trial was pruned. Call once per step on every rank; ranks agree every few steps (stopping.py)."""
        if not self._stepped:
            self._stepped = True
            self._event("first_step")
            # What exists by the first step (modules, model, data) lives as long as the run: the
            # cyclic GC need not walk it again (a full pass over 500k objects took 0.2 s mid-loop).
            gc.freeze()
        agreed = self._stop_agreement.poll(self._stop_requested, self._prune_requested, self._proposed_interval())
        if agreed.checkpoint_every is not None:  # the ranks checked at this step
            self._cadence.step_timed(self._stop_agreement.step_seconds)
            if self._cadence.adopt(agreed.checkpoint_every) and self.dist.is_main:  # the others only follow
                self._announce_interval()
        if agreed.stop:  # every rank gets here together, so they all learn whether it is a prune
            self._prune_requested = agreed.prune
        return agreed.stop

    def _proposed_interval(self) -> float:
        """The main rank's checkpoint interval for `every_steps: auto`, from the saves measured so far."""
        if not (self._cadence.auto and self.dist.is_main):
            return 0.0
        # With the costs of the background saves finished by now (strategies that save collectively
        # report theirs at once, and have no background saver to ask).
        if self._stop_agreement.checks_next and "_checkpointer" in self.__dict__:
            self._checkpointer.poll()
        return self._cadence.proposal()

    def _announce_interval(self) -> None:
        choice = self._cadence.adopted
        assert choice is not None, "the main rank adopts only what it proposed"
        self._event("checkpoint_interval", counted_from_step=self._cadence.last_saved, **choice.record())
        inputs = choice.inputs
        self._reporter.info(
            f"checkpoint every {choice.steps} steps (every_steps: auto): a save costs "
            f"{inputs['checkpoint_save_seconds']:.3f} s, a step {inputs['checkpoint_step_seconds']:.4f} s, "
            f"{inputs['checkpoint_mtbf_seconds']:.0f} s expected between failures"
        )

    @cached_property
    def _stop_agreement(self) -> StopAgreement:
        # Every rank of a trial has the sweep context, so all of them agree on every step.
        return StopAgreement(self.dist, every_step=bool(os.environ.get("TP_SWEEP_CONTEXT")))

    def after_step(
        self,
        step: int,
        state: StateOrMaker,
        metrics: MetricsOrMaker | None = None,
    ) -> bool:
        """The one call at the end of each step, on every rank (STEP: the steps done so far). Reports METRICS
        every training.log_every steps, checkpoints STATE when due, and returns True when the run must stop
        now (a preemption notice, or its trial was pruned) with STATE saved: leave the loop and call finish,
        which ends the run for the platform to resume (or as pruned). STATE may be a function, called only when
        a checkpoint is due; a metric may be a 0-d tensor, read (a wait for the device) only when reported."""
        self._telemetry.steps_done(step)
        if metrics is not None and step % self.spec.training.log_every == 0:
            reported = metrics() if callable(metrics) else metrics
            self.report(step, {name: float(value) for name, value in reported.items()})
        due = self._should_checkpoint(step)
        stop = step < self.spec.training.max_steps and self.should_stop()
        if due or stop:
            self.save(dict(state() if callable(state) else state), step)
        if stop:
            self._stopped_at = step
        return stop

    def __enter__(self) -> TrainingSession:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if kind is None and not self._ended and self._evaluation is None:
            raise RuntimeError("the script left `with TrainingSession.start()` without session.finish(model, step, "
                               "metrics): call it after the loop, also when after_step said to stop")
        if kind is not None:
            self._flush()  # a checkpoint saved before the error is not lost

    # ----- checkpoints --------------------------------------------------------------------
    def save(
        self, state: dict[str, Any], step: int, metrics: dict[str, float] | None = None, *, wait: bool = False
    ) -> None:
        """Checkpoint `state` (replicated across ranks) plus every rank's RNG state.

        Periodic saves are written in the background; `wait=True` (emergency checkpoints) returns
        only once the checkpoint is durable in the store.
        """
        rng_states = distributed.all_gather_rng_states(self.dist)
        if not self.dist.is_main or self._evaluation is not None:  # an evaluation never writes the run's store
            return
        self._last_model_state = state.get("model")  # a reference, for a pruned trial's weights hash
        with self._telemetry.clock.checkpoint():
            self._checkpointer.save(
                step, {"user": state, "rng": rng_states, "step": step}, metrics, wait=wait, overlap=self._overlap_saves
            )

    @cached_property
    def _checkpointer(self) -> RunCheckpointer:
        return RunCheckpointer(
            self._store,
            self._checkpoint_key,
            retention=retention_policy(self.spec.checkpoint),
            background=self.spec.checkpoint.async_save,
            on_saved=self._checkpoint_written,
            on_failed=self._checkpoint_failed,
        )

    def _checkpoint_written(self, manifest: CheckpointManifest) -> None:
        self._measure_save(manifest)
        summary = manifest.summary()
        self._checkpoints.append(summary)
        self._event("checkpoint", step=manifest.step, uri=manifest.uri)
        self._reporter.progress(
            "checkpoint",
            f"checkpoint step {manifest.step}: {manifest.uri} ({summary.get('bytes_written', 0)} bytes written, "
            f"{summary.get('bytes_deduplicated', 0)} deduplicated)",
        )

    def _measure_save(self, manifest: CheckpointManifest, blocked_seconds: float = 0.0) -> None:
        """What the save cost the loop, for `every_steps: auto`: its stall plus its background time
        (see checkpoints/interval.py), or the time the loop waited for it, whichever is longer."""
        record = manifest.save
        self._cadence.measured(max(blocked_seconds, record.stall_seconds + record.background_seconds))

    def _checkpoint_failed(self, step: int, error: str) -> None:
        # Training goes on: the next save tries again, and the previous checkpoint stays restorable.
        self._event("checkpoint_failed", step=step, error=error)
        self._reporter.info(f"checkpoint step {step} failed in the background: {error}; the next save retries")

    def restore(self, into: dict[str, Any] | None = None) -> tuple[dict[str, Any], int] | None:
        """The newest verified checkpoint of this run, with this rank's RNG state restored.

        INTO: the state as `save` was given it, from the model and optimizer this process built: tensors of the
        same path, dtype and shape are read into in place (no allocation, no second copy; the load_state_dict that
        follows finds them already there). A checkpoint that restores overwrites them whole.

        None on a fresh run. Raises CheckpointError, with every checkpoint's reason, when the run
        has checkpoints and none restores: starting over would save over the progress they hold.
        In an evaluation: the checkpoint it evaluates.
        """
        if self._evaluation is not None:
            manifest = exact_checkpoint(self._store, self._evaluation)
            state = self._store.load(manifest)
            distributed.set_rng_state(state["rng"][0])
            self._resumed_from_step = state["step"]
            return state["user"], state["step"]
        restored = self._store.restore_latest(self._checkpoint_key, into=None if into is None else {"user": into})
        if restored is None:
            return None
        for step, reason in restored.skipped:
            self._reporter.info(f"skipped checkpoint step {step}: {reason}")
        state = restored.state
        rng_states = state["rng"]
        distributed.set_rng_state(rng_states[self.dist.rank % len(rng_states)])
        self._resumed_from_step = state["step"]
        self._cadence.saved(state["step"])
        self._telemetry.start_step = state["step"]
        self._event("resumed", step=state["step"], checkpoint=restored.manifest.uri)
        self._checkpoints = [m.summary() for m in self._store.list(self._checkpoint_key)]
        self._reporter.info(f"resumed from checkpoint step {state['step']}: {restored.manifest.uri}")
        return state["user"], state["step"]

    # ----- end ----------------------------------------------------------------------------
    def _exit_preempted(self, step: int) -> None:
        """Leave after the emergency checkpoint with the status launchers read as PREEMPTED (or PRUNED)."""
        sys.exit(self._leave_stopped(step))

    def _leave_stopped(self, step: int) -> int:
        """End a run stopped at STEP after its checkpoint: preempted (the exit code launchers read as PREEMPTED)
        or a pruned trial (0, status PRUNED in its result)."""
        if self._prune_requested:
            return self._leave_pruned(step)
        self._close_checkpointer()
        # torchrun tears down every rank once one exits non-zero: leave together, after the save is durable.
        distributed.barrier(self.dist)
        self._event("preempted", step=step, signal_at=self._signal_at)
        if self.dist.is_main:
            marker = {"step": step, "at": time.time(), "signal_at": self._signal_at}
            (self.run_dir / PREEMPTED_MARKER).write_text(json.dumps(marker))
        self._reporter.info(f"preempted at step {step}: emergency checkpoint written, exiting for requeue")
        self._telemetry.finish("PREEMPTED")
        self._reporter.close()
        distributed.shutdown()
        return PREEMPTED_EXIT_CODE

    def finish(
        self, model: torch.nn.Module | dict[str, torch.Tensor], final_step: int, metrics: dict[str, float]
    ) -> dict:
        """Write the run's result (rank 0), report it to Dagster, leave the process group. Pass the model (its
        state_dict is accepted too): the platform evaluates and registers the model a script hands over here."""
        self._ended = True
        if self._evaluation is not None:
            return self._finish_evaluation(model, final_step)
        if self._stopped_at is not None:  # after_step said to stop: the run ends preempted (or pruned)
            self._exit_code = self._leave_stopped(self._stopped_at)
            return {"status": "PRUNED" if self._prune_requested else "PREEMPTED", "step": self._stopped_at}
        model_state = model.state_dict() if isinstance(model, torch.nn.Module) else model
        self._close_checkpointer()
        if self._cadence.auto and self._cadence.choice is None and final_step > FIRST_AUTO_STEPS:
            self._reporter.info(
                f"every_steps: auto chose no interval (no save was measured, or the script does not call "
                f"should_stop() every step): checkpoints came every {FIRST_AUTO_STEPS} steps"
            )
        num_params = sum(t.numel() for t in model_state.values())
        telemetry_metadata = self._telemetry.finish_and_report(self._reporter, num_params)
        result = self._result("SUCCEEDED", final_step, weights_sha256(model_state), metrics)
        self._event("finished", step=final_step)
        if self.dist.is_main:
            (self.run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2))
            self._reporter.materialization(_metadata(result) | telemetry_metadata)
            self._reporter.info(f"finished at step {final_step}: weights {result['final_weights_sha256'][:12]}")
        self._reporter.close()
        distributed.shutdown()
        return result

    def _finish_evaluation(self, model: torch.nn.Module | dict[str, torch.Tensor], final_step: int) -> dict:
        assert self._evaluation is not None
        test, request = self.dataset("test"), self._evaluation
        logger = self._model_logger or functools.partial(log_pytorch_model, example=self._example)
        result = evaluate_model(model, test, self._evaluator, request, self.run_dir, final_step, logger)
        measured = ", ".join(f"{name} {value:.4f}" for name, value in result["metrics"].items())
        self._reporter.info(f"evaluated the checkpoint of step {final_step}: {measured}")
        self._telemetry.finish("EVALUATED")
        self._reporter.close()
        distributed.shutdown()
        return result

    def _result(self, status: str, final_step: int, weights: str, metrics: dict[str, float]) -> dict:
        """The run's result.json: what launchers, assets and `tp` read back."""
        return {
            "run_id": self.run_id,
            "checkpoint_key": self._checkpoint_key,
            "status": status,
            "final_step": final_step,
            "final_weights_sha256": weights,
            "checkpoints": self._live_checkpoints(),
            "mlflow_run_id": self._reporter.mlflow_run_id,
            "snapshot_id": self.spec.dataset.snapshot_id,
            "resumed_from_step": self._resumed_from_step,
            "world_size": self.dist.world_size,
            "device": self.dist.device.type,
            "train_seconds": round(time.monotonic() - self._started, 3),
            "metrics": metrics,
            # every_steps: auto's last choice and its inputs (None for a fixed interval)
            # What the ranks saved at: a newer proposal the run ended before agreeing on never took effect.
            "checkpoint_interval": self._cadence.adopted.record() if self._cadence.adopted else None,
        }

    def _flush(self) -> None:
        """Wait until every checkpoint in flight is durable (or reported failed); the worker calls it on errors."""
        self._close_checkpointer()

    def _close_checkpointer(self) -> None:
        """Every checkpoint in flight is durable (or reported failed) before the process leaves."""
        if self.dist.is_main and "_checkpointer" in self.__dict__:
            self._checkpointer.close()

    def _live_checkpoints(self) -> list[dict]:
        """Checkpoints still in the store (retention may have pruned older ones)."""
        manifests: list[CheckpointManifest] = self._store.list(self._checkpoint_key)
        return [m.summary() for m in manifests]

    # ----- sweeps -------------------------------------------------------------------------
    def _join_sweep(self) -> None:
        """When launched as a sweep trial, report validation metrics to the study and honour its pruner."""
        # Checked before importing: ordinary runs do not pay for importing Optuna.
        if not self.dist.is_main or not os.environ.get("TP_SWEEP_CONTEXT"):
            return
        from training_platform.sweeps.trial import TrialContext, TrialPruning

        self._pruning = TrialPruning(TrialContext.from_env())

    def _leave_pruned(self, step: int) -> int:
        """A pruned trial ends cleanly (exit 0) after its checkpoint, with status PRUNED in its result."""
        self._close_checkpointer()
        self._event("pruned", step=step)
        if self.dist.is_main:
            model_state = getattr(self, "_last_model_state", None)
            result = self._result(
                "PRUNED",
                step,
                weights_sha256(model_state) if model_state else self._checkpoints[-1]["sha256"],
                {self._pruning.context.metric: self._pruning.last_value},
            ) | {"pruned_at_step": self._pruning.pruned_at}
            (self.run_dir / PRUNED_MARKER).write_text(json.dumps({"step": step, "at": time.time()}))
            (self.run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2))
            self._reporter.materialization(_metadata(result))
            self._reporter.info(f"pruned at step {step}: checkpoint written, trial stopped by the sweep's pruner")
        if self._telemetry is not None:
            self._telemetry.finish("PRUNED")
        self._reporter.close()
        distributed.shutdown()
        return 0


class _Hooks:
    """SessionHooks on one session."""

    def __init__(self, session: TrainingSession):
        self.session = session

    @property
    def store(self) -> CheckpointStore:
        return self.session._store

    @property
    def checkpoint_key(self) -> str:
        return self.session._checkpoint_key

    @property
    def reporter(self) -> Reporter:
        return self.session._reporter

    @property
    def snapshot_root(self) -> Path | str:
        return self.session._snapshot_root

    @property
    def evaluation(self) -> EvaluationRequest | None:
        return self.session._evaluation

    @property
    def exit_code(self) -> int:
        return self.session._exit_code

    def start_writer(self) -> None:
        self.session._checkpointer.start()

    def should_checkpoint(self, step: int) -> bool:
        return self.session._should_checkpoint(step)

    def exit_preempted(self, step: int) -> None:
        self.session._exit_preempted(step)

    def data_wait(self) -> AbstractContextManager[None]:
        return self.session._data_wait()

    def flush(self) -> None:
        self.session._flush()

    def overlap_saves(self) -> None:
        self.session._overlap_saves = True

    def before_update(self) -> None:
        if "_checkpointer" in self.session.__dict__:  # the main rank, once it has saved
            self.session._checkpointer.ready()

    def take_signals(self) -> None:
        signal.signal(signal.SIGTERM, self.session._on_sigterm)

    def restore_candidates(self) -> list[CheckpointManifest]:
        session = self.session
        if session._evaluation is not None:
            return [exact_checkpoint(session._store, session._evaluation)]
        return list(reversed(session._store.list(session._checkpoint_key)))

    def checkpoint_saved(self, manifest: CheckpointManifest, seconds: float = 0.0) -> None:
        session = self.session
        if not session.dist.is_main:
            return
        session._store.apply_retention(session._checkpoint_key, retention_policy(session.spec.checkpoint))
        session._measure_save(manifest, seconds)
        session._telemetry.clock.checkpoint_s += seconds
        session._checkpoints.append(manifest.summary())
        session._event("checkpoint", step=manifest.step, uri=manifest.uri)
        session._reporter.progress(
            "checkpoint", f"checkpoint step {manifest.step} ({manifest.attributes.get('format')}): {manifest.uri}"
        )

    def checkpoint_failed(self, step: int, error: str) -> None:
        if self.session.dist.is_main:
            self.session._checkpoint_failed(step, error)

    def checkpoint_restored(self, manifest: CheckpointManifest, step: int) -> None:
        session = self.session
        session._resumed_from_step = step
        session._cadence.saved(step)
        session._telemetry.start_step = step
        session._event("resumed", step=step, checkpoint=manifest.uri)
        session._checkpoints = [m.summary() for m in session._store.list(session._checkpoint_key)]
        session._reporter.info(f"resumed from checkpoint step {step}: {manifest.uri}")

    def step_started(self) -> None:
        self.session._telemetry.clock.step_started()

    def log_model_with(self, logger: ModelLogger) -> None:
        self.session._model_logger = logger


def _metadata(result: dict) -> dict:
    nested = ("checkpoints", "metrics", "checkpoint_interval")
    flat = {k: v for k, v in result.items() if k not in nested and v is not None}
    flat.update({f"final_{k}": v for k, v in result["metrics"].items()})
    flat.update(result.get("checkpoint_interval") or {})
    flat["checkpoint_count"] = len(result["checkpoints"])
    return flat
