"""The token `tp` sends to a platform server: `TP_TOKEN` (CI), else the one `tp login` saved for that server.

Saved tokens live in `$XDG_CONFIG_HOME/tp/credentials.json` (default `~/.config`), readable by their owner only
(the directory 0700, the file 0600), one per server URL and one per platform home for the home's own server,
whose URL changes when it restarts on another port.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from training_platform.errors import PlatformError
from training_platform.state.private_files import write_private

TOKEN_ENV = "TP_TOKEN"
CREDENTIALS_FILE = "credentials.json"


def credentials_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "tp" / CREDENTIALS_FILE


def server_key(url: str) -> str:
    """A server's URL as credentials are kept by: scheme, host and port (no path, no trailing slash)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise PlatformError(f"{url!r} is not a server URL: write it as http://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}".lower()


def home_key(home_root: Path) -> str:
    return "home:" + str(Path(home_root).resolve())


def saved_token(*keys: str) -> str | None:
    """TP_TOKEN, else the first token saved under one of KEYS (server_key, home_key)."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    saved = _read()
    return next((saved[key] for key in keys if key in saved), None)


def save_token(token: str, *keys: str) -> Path:
    """Keep TOKEN under each of KEYS, for this account only; the file's path."""
    path = credentials_path()
    write_private(path, json.dumps({"tokens": _read() | dict.fromkeys(keys, token)}, indent=2))
    return path


def _read() -> dict[str, str]:
    path = credentials_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PlatformError(f"cannot read your saved tokens ({path}): {exc}; run `tp login` again") from exc
    tokens = raw.get("tokens", {}) if isinstance(raw, dict) else {}
    return {str(key): str(value) for key, value in tokens.items()}
