"""A training run as the platform keeps it: its spec, its events, its attempts, where it came from.

The worker and the launchers write a run's files and events, so this package sits below them (ARCHITECTURE.md).

- `specs.py`: the spec each run (a Dagster partition) was created with, its run id and queue tags;
  `registry.py` keeps them (a file per run in the home) and `registry_db.py` as a table of the platform's database;
  `backends.py` chooses between the two (`open_run_registry`).
- `layout.py`: the files of a run directory, each named once.
- `events.py`: a run's event log, one JSON object per line in its run directory, appended by rank 0.
- `attempts.py`: resuming an unfinished attempt, or reproducing a finished one; `reproduce.py` compares a
  reproduction with the run it reproduces.
- `lineage.py`: the lineage key, what a run was made from.
- `remote_files.py`: a run's files through object storage, for jobs that share no disk with the Dagster side.
- `retraining.py`: retraining by day, one run per spec and day (`<spec name>-<YYYY-MM-DD>`).
"""
