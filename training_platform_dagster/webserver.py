"""The platform's webserver: `dagster-webserver`, with every request authenticated (training_platform/server/auth.py).

Dagster's open-source webserver has no authentication. Its command line is kept whole (the same options, the same
uvicorn server); the app it builds is wrapped in `Authenticate`, which knows the tokens of the platform home in
TP_HOME (training_platform/server/tokens.py).

    python -m training_platform_dagster.webserver -h 127.0.0.1 -p 3000 -w workspace.yaml   (dagster-webserver's)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster_webserver import cli

from training_platform.server.auth import Authenticate, serve_requests_only
from training_platform.server.tokens import TokenStore


def main() -> None:
    serve_requests_only()
    tokens = TokenStore(Path(os.environ["TP_HOME"]))
    build_app = cli.create_app_from_workspace_process_context

    def authenticated_app(*args: Any, **kwargs: Any) -> Authenticate:
        return Authenticate(build_app(*args, **kwargs), tokens.user_of)

    # The one seam: cli.host_dagster_ui_with_workspace_process_context builds the app through this module global.
    cli.create_app_from_workspace_process_context = authenticated_app
    cli.main()


if __name__ == "__main__":
    main()
