"""Telemetry of one training process: the SDK's side of samplers, figures and plots.

`TrainingSession` owns one `WorkerTelemetry`. Local rank 0 of each node samples the node's
devices in a background thread; the main rank keeps the metric history, writes the live
`telemetry.json`, and at the end turns everything into figures, plots and metadata.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from training_platform.spec import TrainSpec
from training_platform.telemetry.figures import RunClock, RunFigures, cost_usd, hourly_rate, run_figures
from training_platform.telemetry.monitor import DEFAULT_INTERVAL_S, INTERVAL_ENV, SystemMonitor
from training_platform.telemetry.records import write_telemetry
from training_platform.telemetry.samplers import SystemSample

MAX_FILE_POINTS = 4000  # utilization points kept in telemetry.json; older ones are thinned
PLOTS_DIR = "plots"


@dataclass
class WorkerTelemetry:
    spec: TrainSpec
    run_id: str
    run_dir: Path
    is_main: bool
    samples_node: bool
    """local rank 0: this process samples the node"""
    node_rank: int = 0
    clock: RunClock = field(default_factory=RunClock)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    start_step: int = 0
    monitor: SystemMonitor | None = None
    rate_per_hour: float = 0.0
    _last_write: float = 0.0
    _write_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, spec: TrainSpec, run_id: str, run_dir: Path, rank: int, local_rank: int, local_world_size: int):
        telemetry = cls(
            spec=spec,
            run_id=run_id,
            run_dir=run_dir,
            is_main=rank == 0,
            samples_node=local_rank == 0,
            node_rank=rank // max(local_world_size, 1),
            rate_per_hour=hourly_rate(spec),
        )
        if telemetry.samples_node:
            interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
            telemetry.monitor = SystemMonitor(interval_s=interval, on_sample=telemetry._on_sample).start()
            telemetry.write("RUNNING", force=True)
        return telemetry

    @property
    def step(self) -> int:
        return self.start_step + self.clock.steps

    def steps_done(self, step: int) -> None:
        """STEP steps are done: count those the loop's own hooks (`data_wait`, `step_started`) did not, as in
        a plain script, which calls only `after_step`; `tp runs` and the deadline's pace read the count."""
        if step > self.step:
            self.clock.step_started(step - self.step)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        if self.is_main:
            self.history.append((step, dict(metrics)))

    def _on_sample(self, sample: SystemSample) -> None:
        self.write("RUNNING")

    def samples(self) -> list[SystemSample]:
        return self.monitor.snapshot() if self.monitor else []

    def payload(self, status: str, figures: RunFigures | None = None) -> dict:
        samples = self.samples()
        if len(samples) > MAX_FILE_POINTS:
            samples = samples[:: len(samples) // MAX_FILE_POINTS + 1]
        elapsed = self.clock.elapsed()
        loop_s = self.clock.loop_seconds()
        return {
            "run_id": self.run_id,
            "family": self.spec.name,
            "team": self.spec.team,
            "node_rank": self.node_rank,
            "status": status,
            "started_at": self.clock.started_wall,
            "updated_at": time.time(),
            "ended_at": time.time() if status != "RUNNING" else None,
            "device": self.monitor.device if self.monitor else "cpu",
            "step": self.step,
            "max_steps": self.spec.training.max_steps,
            # This attempt's pace over its training loop: what a deadline is judged by (preemption.py).
            "steps_per_second": round(self.clock.steps / loop_s, 4) if loop_s > 0 else None,
            "metrics": self.history[-1][1] if self.history else {},  # the latest reported, for live views
            "utilization": [[round(s.t, 3), s.utilization_pct] for s in samples],
            "data_wait_fraction": round(self.clock.data_wait_s / max(self.clock.loop_seconds(), 1e-9), 4),
            "checkpoint_overhead": round(self.clock.checkpoint_s / max(self.clock.loop_seconds(), 1e-9), 4),
            "cost_usd": round(cost_usd(self.rate_per_hour, elapsed), 6),
            "cost_per_hour_usd": round(self.rate_per_hour, 4),
            "figures": figures.to_dict() if figures else None,
        }

    def write(self, status: str, figures: RunFigures | None = None, force: bool = False) -> None:
        """The live file: the main node writes telemetry.json, other nodes telemetry-node<N>.json."""
        if not self.samples_node:
            return
        now = time.monotonic()
        # Throttled: a reader needs a fresh picture every few seconds, not every sample.
        if not force and now - self._last_write < 2.0:
            return
        with self._write_lock:
            self._last_write = now
            payload = self.payload(status, figures)
            name = "telemetry.json" if self.is_main else f"telemetry-node{self.node_rank}.json"
            write_telemetry(self.run_dir, payload, name)

    def finish(self, status: str, num_params: int | None = None) -> tuple[RunFigures, list[SystemSample]]:
        """Stop sampling; the run's figures and samples (written to telemetry.json by the main rank)."""
        samples = self.monitor.stop() if self.monitor else []
        reported = [m["mfu"] for _, m in self.history if "mfu" in m]
        mfu = statistics.median(reported) if reported else None
        figures = run_figures(self.clock, self.spec, samples, num_params, self.rate_per_hour, mfu)
        self.write(status, figures, force=True)
        return figures, samples

    def write_plots(self, samples: list[SystemSample], utilization_floor: float | None = 50.0) -> dict[str, Path]:
        """loss_curve.png, utilization.png and cost.png in the run directory's plots/ folder."""
        from training_platform.telemetry import plots

        out = self.run_dir / PLOTS_DIR
        t0 = samples[0].t if samples else self.clock.started_wall
        start = self.clock.started_wall
        cost_points = [(0.0, 0.0)] + [
            (s.t - t0, cost_usd(self.rate_per_hour, s.t - start)) for s in samples if s.t >= start
        ]
        return {
            "loss_curve": plots.loss_curves(self.history, out / "loss_curve.png", title=self.run_id),
            "utilization_plot": plots.utilization_over_time(samples, out / "utilization.png", utilization_floor),
            "cost_plot": plots.cost_over_time(cost_points, out / "cost.png"),
        }

    def finish_and_report(self, reporter, num_params: int | None = None) -> dict:
        """End of a run: figures to MLflow (system metrics too), plots as artifacts; Pipes metadata back.

        `reporter` is the SDK's Reporter (only the main rank's reports anything).
        """
        figures, samples = self.finish("SUCCEEDED", num_params)
        if not self.is_main:
            return {}
        reporter.metric_series(_system_points(samples))
        now_ms = int(time.time() * 1000)
        reporter.metric_series([(f"run/{k}", v, now_ms, self.step) for k, v in figures.metrics().items()])
        metadata: dict = {k: v for k, v in figures.to_dict().items() if v is not None}
        try:
            paths = self.write_plots(samples)
        except Exception as exc:  # noqa: BLE001 - a plotting failure must not fail a finished run
            reporter.info(f"telemetry: plots not written ({type(exc).__name__}: {exc})")
            return metadata
        reporter.artifacts(list(paths.values()), artifact_path=PLOTS_DIR)
        from training_platform.telemetry.plots import markdown_image

        for name, path in paths.items():
            metadata[name] = {"raw_value": markdown_image(path, name.replace("_", " ")), "type": "md"}
        metadata["plots_dir"] = {"raw_value": str(self.run_dir / PLOTS_DIR), "type": "path"}
        return metadata


def _system_points(samples: list[SystemSample]) -> list[tuple[str, float, int, int]]:
    """MLflow system metrics, one point per sample, stepped by sample index."""
    points = []
    for i, s in enumerate(samples):
        ts = int(s.t * 1000)
        points.append(("system/utilization_pct", s.utilization_pct, ts, i))
        points.append(("system/memory_used_mb", s.memory_used_mb, ts, i))
        if s.power_w is not None:
            points.append(("system/power_w", s.power_w, ts, i))
        if s.host_cpu_pct is not None:
            points.append(("system/host_cpu_pct", s.host_cpu_pct, ts, i))
    return points
