"""Where a deployment's cost ledger lives: chosen here, above both backends.

The platform's database when ``TP_DATABASE_URL`` names one (ledger_db.py: every machine of a team's deployment sees
the same charges), else ``cost/ledger.jsonl`` in the platform home (accounting.py's CostLedger, the embedded default).
"""

from __future__ import annotations

from pathlib import Path

from training_platform.cost.accounting import CostLedger, LedgerQueries
from training_platform.paths import database_url


def open_ledger(home_root: Path) -> LedgerQueries:
    """The deployment's ledger: in the platform's database when ``TP_DATABASE_URL`` names one (every machine
    of a team's deployment sees the same charges), else ``cost/ledger.jsonl`` in the home."""
    if url := database_url():
        from training_platform.cost.ledger_db import DatabaseLedger  # SQLAlchemy only when asked for

        return DatabaseLedger(url)
    return CostLedger(Path(home_root) / "cost")
