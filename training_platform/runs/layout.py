"""A run directory's files, named once: the worker, the launchers and the orchestrator all read and write them.

The directory is `PlatformHome.run_dir(run_id)` (paths.py); on Kubernetes its files travel through object storage
(remote_files.py).
"""

from __future__ import annotations

EVENTS_FILE = "events.jsonl"
"""The run's event log (events.py), appended by rank 0, the launchers and the batch script."""
RESULT_FILE = "result.json"
"""What the worker's main rank writes when the run ends (SUCCEEDED or PRUNED): the run's result."""
EVALUATION_FILE = "evaluation.json"
"""What a script's evaluation writes (train/evaluation_mode.py): its metrics on the test split."""
PREEMPTED_MARKER = "preempted.json"
"""Left by a worker that checkpointed and stopped on a preemption: torchrun and srun replace exit codes."""
PRUNED_MARKER = "pruned.json"
"""Left by a sweep trial its pruner stopped."""
TELEMETRY_FILE = "telemetry.json"
"""The run's figures (step time, utilization, cost so far), rewritten by the main rank as it trains."""
