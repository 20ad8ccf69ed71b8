"""A running job's last durable checkpoint, published on the job itself, where schedulers and operators read it.

No scheduler knows how much work a preemption would destroy (Kueue issue 477 asks for it): a run that saved a
moment ago loses nothing, one that saved an hour ago loses an hour. The training asset publishes each new
checkpoint its job saved: the step and when it was saved (the work lost if the job were preempted now is
everything since then). On Slurm it is the job's comment (`squeue -o %k`, `scontrol show job`); on Kubernetes,
annotations on the Job.

On Kubernetes it also orders preemption among Jobs of equal priority, so that the one that would lose least goes
first: Kueue preempts lower priorities first, and a Job that saved within the last CHECKPOINTED_WITHIN_S carries
its priority class's `-checkpointed` twin, one below it (deploy/kubernetes/kueue/priority-classes.yaml), until
that save grows old. Kueue keeps the priority-class label mutable for this. Slurm cannot be steered so: its
preemption plugins order the jobs they may preempt by partition tier and size (preempt/partition_prio) or QoS
(preempt/qos), never by a job's own priority or nice (checked on Slurm 22.05, and in today's source); there the
launcher reads these comments and chooses the victims itself (launch/slurm_preemption.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

SLURM_COMMENT_PREFIX = "tp-checkpoint"
STEP_ANNOTATION = "training-platform.io/checkpoint-step"
SAVED_AT_ANNOTATION = "training-platform.io/checkpoint-saved-at"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
CHECKPOINTED_SUFFIX = "-checkpointed"
CHECKPOINTED_WITHIN_S = 600.0


@dataclass(frozen=True)
class DurableCheckpoint:
    step: int
    saved_at: float  # seconds since the epoch, when the worker recorded the save as durable

    @property
    def saved_at_iso(self) -> str:
        return datetime.fromtimestamp(self.saved_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def slurm_comment(self) -> str:
        # One word: `scontrol show job -o` prints Key=Value pairs split at spaces.
        return f"{SLURM_COMMENT_PREFIX}:step={self.step};saved_at={self.saved_at_iso}"

    @classmethod
    def from_slurm_comment(cls, comment: str) -> DurableCheckpoint | None:
        """The checkpoint a job's comment names (slurm_comment's inverse); None for any other comment."""
        prefix = SLURM_COMMENT_PREFIX + ":"
        if not comment.startswith(prefix):
            return None
        fields = dict(item.partition("=")[::2] for item in comment.removeprefix(prefix).split(";"))
        try:
            saved_at = datetime.strptime(fields.get("saved_at", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            return cls(step=int(fields.get("step", "")), saved_at=saved_at.timestamp())
        except ValueError:
            return None  # someone else's comment that happens to start so

    def priority_class(self, current: str, now: float) -> str:
        """The Kueue priority class for a Job whose class is `current` (its own, or its `-checkpointed` twin)."""
        own = current.removesuffix(CHECKPOINTED_SUFFIX)
        return own + CHECKPOINTED_SUFFIX if now - self.saved_at < CHECKPOINTED_WITHIN_S else own

    def job_annotations(self) -> dict[str, str]:
        return {STEP_ANNOTATION: str(self.step), SAVED_AT_ANNOTATION: self.saved_at_iso}


def newest_checkpoint(events: list[dict]) -> DurableCheckpoint | None:
    """The newest checkpoint in a run's event log (the worker records a save once it is durable)."""
    for event in reversed(events):
        if event.get("kind") == "checkpoint":
            return DurableCheckpoint(step=int(event["step"]), saved_at=float(event["at"]))
    return None
