"""`tp`, the platform's command line: one module per command group, parsing and printing only.

`main.py` is the `tp` application (the console script) and composes the groups; `common.py` holds what every
command shares (the console, one-line errors, `--json` output, the platform home) and `follow.py` how a run is shown
while `tp` follows it. The groups: `runs.py` (runs, logs, cancel, resume, reproduce), `checkpoints.py`,
`snapshots.py`, `server.py`, `cost.py`, `lifecycle.py` (`tp gc`) and `telemetry.py` (status, metrics, doctor).
"""
