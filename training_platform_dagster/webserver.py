"""The platform's webserver: `dagster-webserver`, with every request authenticated (training_platform/server/auth.py)
and every change held to the rights of who asks (training_platform/server/operations.py).

Dagster's open-source webserver has neither. Its command line is kept whole (the same options, the same uvicorn
server); the app it builds is wrapped in `Authorize`, which asks the teams file of the platform home in TP_HOME who
may act for which team (training_platform/policy/rights.py), inside `Authenticate`, which knows its tokens
(training_platform/server/tokens.py).

    python -m training_platform_dagster.webserver -h 127.0.0.1 -p 3000 -w workspace.yaml   (dagster-webserver's)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster._core.workspace.context import IWorkspaceProcessContext
from dagster_webserver import cli

from training_platform.policy.rights import is_admin, may_act_for_team
from training_platform.server.auth import Authenticate, serve_requests_only
from training_platform.server.operations import Authorize
from training_platform.server.tokens import TokenStore


def main() -> None:
    serve_requests_only()
    home_root = Path(os.environ["TP_HOME"])
    tokens = TokenStore(home_root)
    build_app = cli.create_app_from_workspace_process_context

    def authenticated_app(process_context: IWorkspaceProcessContext, *args: Any, **kwargs: Any) -> Authenticate:
        instance = process_context.instance

        def may_act_on_run(user: str, run_id: str) -> bool:
            run = instance.get_run_by_id(run_id)
            return run is None or may_act_for_team(user, run.tags.get("team"), home_root)  # none: Dagster says so

        rights = Authorize(build_app(process_context, *args, **kwargs), lambda user: is_admin(user, home_root),
                           may_act_on_run)
        return Authenticate(rights, tokens.user_of)

    # The one seam: cli.host_dagster_ui_with_workspace_process_context builds the app through this module global.
    cli.create_app_from_workspace_process_context = authenticated_app
    cli.main()


if __name__ == "__main__":
    main()
