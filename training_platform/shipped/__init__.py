"""Files the platform needs at run time, shipped inside the package so an installed wheel has them.

`examples/digits.yaml`, `examples/digits-daily.yaml` and `deploy/dagster/dagster.yaml` in the source
tree are links to these files: one copy, read the same way from a checkout and from site-packages.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

DEMO_SPEC = _HERE / "digits.yaml"
"""`tp demo`'s run (examples/digits.yaml)."""
DAILY_SPEC = _HERE / "digits-daily.yaml"
"""The nightly retraining's and `tp retrain`'s default spec (examples/digits-daily.yaml)."""
INSTANCE_CONFIG = _HERE / "dagster.yaml"
"""The Dagster instance config `tp server start` writes to a new home: the queue (deploy/dagster/dagster.yaml)."""
