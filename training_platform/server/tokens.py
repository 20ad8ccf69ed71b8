"""API tokens of a platform home: who a request to its server is.

`tp admin token create USER` makes one and prints it once; the home keeps only its SHA-256 (a token is 32 random
bytes, so a plain hash is as good as a slow one), in `auth/tokens.json`, which only the server's account can read
(the directory 0700, the file 0600). The server maps a request's token to its user; `tp` sends the token that
`tp login` saved or `TP_TOKEN` names (client/credentials.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from training_platform.errors import PlatformError
from training_platform.identifiers import PLATFORM_USER, check_user_name
from training_platform.state.documents import file_lock
from training_platform.state.private_files import write_private

AUTH_DIR = "auth"
TOKENS_FILE = "tokens.json"
PREFIX = "tp_"  # what a token starts with: a leaked one is recognisable in a log or a repository


@dataclass(frozen=True)
class TokenRecord:
    user: str
    sha256: str
    created_at: float
    label: str = ""


class TokenStore:
    """The tokens of the platform home at HOME_ROOT."""

    def __init__(self, home_root: Path):
        self.directory = Path(home_root) / AUTH_DIR
        self.path = self.directory / TOKENS_FILE
        # The server asks for every request: the file is read again only when it changed (a revocation counts at once).
        self._cached: tuple[tuple[int, int, int], list[TokenRecord]] | None = None

    def create(self, user: str, label: str = "") -> str:
        """A new token for USER, returned once; only its hash is kept."""
        if check_user_name(user) == PLATFORM_USER:
            raise PlatformError(f"{PLATFORM_USER!r} is the platform server's own user; create tokens for people")
        return self._add(user, label, replace=False)

    def renew_server_token(self) -> str:
        """A new token for the server's own user, and the one before it revoked."""
        return self._add(PLATFORM_USER, "the server's own", replace=True)

    def _add(self, user: str, label: str, replace: bool) -> str:
        token = PREFIX + secrets.token_urlsafe(32)
        record = TokenRecord(user=user, sha256=_digest(token), created_at=time.time(), label=label)
        with self._locked():
            kept = [r for r in self._read() if not (replace and r.user == user)]
            self._write([*kept, record])
        return token

    def user_of(self, token: str) -> str | None:
        """The user TOKEN belongs to; None for a token this home never made or has revoked."""
        if not token.startswith(PREFIX):
            return None
        digest = _digest(token)
        for record in self._read():
            if secrets.compare_digest(record.sha256, digest):
                return record.user
        return None

    def tokens(self, user: str | None = None) -> list[TokenRecord]:
        return [record for record in self._read() if user is None or record.user == user]

    def revoke(self, user: str) -> int:
        """Revoke every token of USER; how many there were."""
        with self._locked():
            records = self._read()
            kept = [record for record in records if record.user != user]
            self._write(kept)
        return len(records) - len(kept)

    def _locked(self):
        self._make_directory()
        return file_lock(self.directory / (TOKENS_FILE + ".lock"))

    def _make_directory(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)

    def _read(self) -> list[TokenRecord]:
        try:
            status = self.path.stat()
            version = (status.st_mtime_ns, status.st_size, status.st_ino)
            if self._cached is not None and self._cached[0] == version:
                return self._cached[1]
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise PlatformError(f"cannot read the tokens of this home ({self.path}): {exc}") from exc
        records = [TokenRecord(**entry) for entry in raw.get("tokens", [])]
        self._cached = (version, records)
        return records

    def _write(self, records: list[TokenRecord]) -> None:
        write_private(self.path, json.dumps({"tokens": [asdict(record) for record in records]}, indent=2))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
