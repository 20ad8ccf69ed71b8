"""Compare a reproduction with the run it reproduces: "reproduced exactly", or a precise diff.

A run record is what the training_run asset keeps per materialization: the worker's result, the
resolved spec, the lineage key and the environment lock (installed packages).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Metrics must agree this closely where weights cannot be bitwise equal (GPUs, other devices).
METRIC_TOLERANCE = 1e-3

LINEAGE_FIELDS = {
    "code_commit": "code commit",
    "snapshot_id": "dataset snapshot",
    "spec_hash": "spec",
    "seed": "seed",
    "backend": "backend",
    "script_sha256": "training script",
}


@dataclass
class ReproductionReport:
    original_run: str
    weights_equal: bool
    metrics_agree: bool
    differences: list[str] = field(default_factory=list)
    reasons_not_exact: list[str] = field(default_factory=list)
    metric_deltas: dict[str, float] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """Bitwise the same weights from the same lineage: nothing differs, nothing unrecoverable."""
        return self.weights_equal and not self.reasons_not_exact and not self.differences

    @property
    def passed(self) -> bool:
        """Exact on deterministic backends (CPU); metric agreement within tolerance elsewhere."""
        deterministic = not any("device" in d for d in self.differences)
        return self.weights_equal if deterministic else self.metrics_agree

    def summary(self) -> str:
        if self.exact:
            return f"reproduced exactly: bitwise the same weights as {self.original_run}"
        head = "same weights" if self.weights_equal else "weights differ"
        details = self.reasons_not_exact + self.differences
        return f"{head} from {self.original_run}: " + ("; ".join(details) if details else "no lineage difference")

    def to_dict(self) -> dict:
        return asdict(self) | {"exact": self.exact, "passed": self.passed, "summary": self.summary()}


def compare(original: dict, reproduction: dict) -> ReproductionReport:
    """What differs between two run records, and whether the results agree."""
    before, after = original["lineage"], reproduction["lineage"]
    differences = [
        f"{label}: {before.get(key)} -> {after.get(key)}"
        for key, label in LINEAGE_FIELDS.items()
        if before.get(key) != after.get(key)
    ]
    if original.get("device") != reproduction.get("device"):
        differences.append(f"device: {original.get('device')} -> {reproduction.get('device')}")
    differences += package_differences(original.get("environment", []), reproduction.get("environment", []))

    reasons = []
    if before.get("code_dirty"):
        reasons.append("the original ran from a dirty tree (uncommitted changes): its code cannot be recovered")
    deltas = {
        name: abs(value - reproduction.get("metrics", {}).get(name, math.nan))
        for name, value in original.get("metrics", {}).items()
    }
    return ReproductionReport(
        original_run=original["run_id"],
        weights_equal=original["final_weights_sha256"] == reproduction["final_weights_sha256"],
        metrics_agree=all(delta <= METRIC_TOLERANCE for delta in deltas.values()),
        differences=differences,
        reasons_not_exact=reasons,
        metric_deltas=deltas,
    )


def package_differences(before: list[str], after: list[str]) -> list[str]:
    """`name: 1.0 -> 1.1`, `name: added 2.0`, `name: removed 1.0` for each package that changed."""
    old = dict(line.split("==", 1) for line in before if "==" in line)
    new = dict(line.split("==", 1) for line in after if "==" in line)
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            changes.append(f"package {name}: removed {old[name]}")
        elif name not in old:
            changes.append(f"package {name}: added {new[name]}")
        elif old[name] != new[name]:
            changes.append(f"package {name}: {old[name]} -> {new[name]}")
    return changes
