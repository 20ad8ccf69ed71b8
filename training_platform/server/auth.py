"""Every request to the platform server authenticated: an ASGI middleware in front of Dagster's webserver app.

Dagster's open-source webserver has no authentication, so the platform brings it (training_platform_dagster/
webserver.py wraps Dagster's app in `Authenticate`). A request is served only with a valid token (tokens.py): as a
bearer token (`tp`, scripts) or as the session cookie the sign-in page sets (a browser). Besides:

- a mutation is accepted only as a POST of `application/json`: a GET with `query=mutation{...}` or a form POST
  (what any web page can make a browser send) is refused;
- a request the cookie authenticates that changes something, and a websocket it opens, must come from the
  server's own origin (`Origin`), so another site cannot act through a signed-in browser;
- `/server_info` (Dagster's liveness answer) and the sign-in page are the only paths open without a token.

The user is put in the request's ASGI scope (`tp_user`), and is `request_user()` while the request is served: the
run coordinator (training_platform_dagster/run_coordinator.py) reads it there, from no other source. `GET /whoami`
answers who the token is (`tp` checks its rights before it submits). Every page the browser
loads shows who is signed in, with a sign-out button (a form POSTed to `/signout`, which clears the cookie).
"""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from training_platform.errors import RightsError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE = "tp_session"
SIGNIN_PATH = "/signin"
SIGNOUT_PATH = "/signout"
USER_SCOPE_KEY = "tp_user"
OPEN_PATHS = frozenset({"/server_info"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WHOAMI_PATH = "/whoami"
MAX_SIGNIN_BODY = 4096

_REQUEST_USER: ContextVar[str | None] = ContextVar("tp_request_user", default=None)
_serves_requests = False  # set in the webserver: everything it submits comes from a request


def serve_requests_only() -> None:
    """Mark this process as the webserver: from now on a submission outside a signed-in request is refused, never
    taken for the platform's own (a thread that lost the request's context cannot run as the platform)."""
    global _serves_requests  # noqa: PLW0603 - one switch per process, set once at its start
    _serves_requests = True


def request_user() -> str | None:
    """Who sent the request being served; None outside requests (the daemon, a run's own process: the platform)."""
    user = _REQUEST_USER.get()
    if user is None and _serves_requests:
        raise RightsError("the server cannot tell who asked for this (no signed-in request); sign in and ask again")
    return user


class Authenticate:
    """Serve APP only to requests whose token `user_of` knows (None: unknown or revoked)."""

    def __init__(self, app: ASGIApp, user_of: Callable[[str], str | None]):
        self.app = app
        self.user_of = user_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        headers = _headers(scope)
        path = scope.get("path", "")
        if scope["type"] == "http" and path == SIGNIN_PATH:
            await self._signin(scope, receive, send, headers)
            return
        if scope["type"] == "http" and path == SIGNOUT_PATH:
            await _signout(scope, send, headers)
            return
        if path in OPEN_PATHS and scope["type"] == "http" and scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        user, by_cookie = self._user(headers)
        if user is None:
            await _refuse_unknown(scope, send, headers)
            return
        problem = _request_problem(scope, headers, by_cookie)
        if problem is not None:
            status, message = problem
            await refuse(scope, send, status, message)
            return
        if scope["type"] == "http" and path == WHOAMI_PATH:
            await _json(send, 200, {"user": user})
            return
        if scope["type"] == "http" and scope["method"] == "GET":
            send = _showing_user(send, user)
        serving = _REQUEST_USER.set(user)
        try:
            await self.app({**scope, USER_SCOPE_KEY: user}, receive, send)
        finally:
            _REQUEST_USER.reset(serving)

    def _user(self, headers: dict[str, str]) -> tuple[str | None, bool]:
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return self.user_of(credentials.strip()), False
        token = _cookies(headers).get(SESSION_COOKIE)
        return (self.user_of(token), True) if token else (None, False)

    async def _signin(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        target = _local_target(query.get("next", ["/"])[0])
        if scope["method"] in SAFE_METHODS:
            await _html(send, 200, _signin_page(target, error=None))
            return
        if scope["method"] != "POST" or not _same_origin(scope, headers, required=False):
            await refuse(scope, send, 403, "sign in from the server's own sign-in page")
            return
        form = parse_qs((await _body(receive, MAX_SIGNIN_BODY)).decode("utf-8", "replace"))
        token = form.get("token", [""])[0].strip()
        target = _local_target(form.get("next", [target])[0])
        user = self.user_of(token) if token else None
        if user is None:
            await _html(send, 401, _signin_page(target, error="That token is not valid here; ask an admin for one."))
            return
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = f"{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
        headers = [(b"location", target.encode()), (b"set-cookie", cookie.encode()), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


async def _signout(scope: Scope, send: Send, headers: dict[str, str]) -> None:
    """Clear the session cookie (a POST from the server's own page) and go to the sign-in page."""
    if scope["method"] != "POST" or not _same_origin(scope, headers, required=True):
        await refuse(scope, send, 403, "sign out with the button on the server's own pages")
        return
    cookie = f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
    out = [(b"location", SIGNIN_PATH.encode()), (b"set-cookie", cookie.encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 303, "headers": out})
    await send({"type": "http.response.body", "body": b""})


def _showing_user(send: Send, user: str) -> Send:
    """SEND, with an HTML page's body given a corner that names USER and a sign-out button (Dagster's pages are
    its app's, not ours: this is the one place a person sees who they are to the server)."""
    started: MutableMapping[str, Any] | None = None
    chunks: list[bytes] = []

    async def send_with_user(message: MutableMapping[str, Any]) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            headers = {name.lower(): value for name, value in message.get("headers", [])}
            if not headers.get(b"content-type", b"").startswith(b"text/html") or b"content-encoding" in headers:
                await send(message)
                return
            started = message  # held until the body is whole: its length changes
            return
        if started is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = _with_user_corner(b"".join(chunks), user)
        headers = [(k, v) for k, v in started.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**started, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return send_with_user


def _with_user_corner(body: bytes, user: str) -> bytes:
    corner = (
        f'<form id="tp-user" method="post" action="{SIGNOUT_PATH}" style="position:fixed;right:10px;bottom:10px;'
        "z-index:2147483647;margin:0;padding:4px 8px;font:12px sans-serif;background:#fff;color:#333;"
        'border:1px solid #ccc;border-radius:6px">signed in as <b>'
        f'{html.escape(user)}</b> <button type="submit">Sign out</button></form>'
    ).encode()
    at = body.rfind(b"</body>")
    return body[:at] + corner + body[at:] if at >= 0 else body


def _request_problem(scope: Scope, headers: dict[str, str], by_cookie: bool) -> tuple[int, str] | None:
    """Why an authenticated request is still refused (status, message); None to serve it."""
    if scope["type"] == "websocket":
        if by_cookie and not _same_origin(scope, headers, required=True):
            return 403, "a websocket from another origin"
        return None
    method = scope["method"]
    if by_cookie and method not in SAFE_METHODS and not _same_origin(scope, headers, required=True):
        return 403, "a change sent with the session cookie must come from the server's own pages (Origin)"
    if scope.get("path", "").endswith("/graphql"):
        if method == "GET" and _names_a_mutation(scope):
            return 405, "a mutation is accepted only as a POST of application/json"
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if method == "POST" and content_type != "application/json":
            return 415, "GraphQL requests are accepted only as application/json"
    return None


def _names_a_mutation(scope: Scope) -> bool:
    """Whether a GET's `query` holds a mutation; a query that does not parse counts as one (refused, not guessed)."""
    from graphql import OperationType, parse
    from graphql.error import GraphQLSyntaxError
    from graphql.language import OperationDefinitionNode

    query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("query", [""])[0]
    if not query:
        return False
    try:
        document = parse(query)
    except GraphQLSyntaxError:
        return True
    return any(
        isinstance(node, OperationDefinitionNode) and node.operation != OperationType.QUERY
        for node in document.definitions
    )


def _same_origin(scope: Scope, headers: dict[str, str], required: bool) -> bool:
    origin = headers.get("origin")
    if origin is None:
        return not required
    own = f"{scope.get('scheme', 'http').replace('ws', 'http')}://{headers.get('host', '')}"
    return origin.lower() == own.lower()


async def _refuse_unknown(scope: Scope, send: Send, headers: dict[str, str]) -> None:
    """A browser's page load goes to the sign-in page; anything else gets 401."""
    wants_page = scope["type"] == "http" and scope["method"] == "GET" and "text/html" in headers.get("accept", "")
    if wants_page and not scope.get("path", "").endswith("/graphql"):
        query = scope.get("query_string", b"").decode("latin-1")
        target = scope.get("path", "/") + (f"?{query}" if query else "")
        location = f"{SIGNIN_PATH}?next={quote(_local_target(target), safe='')}"
        await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location.encode())]})
        await send({"type": "http.response.body", "body": b""})
        return
    await refuse(scope, send, 401, "sign in: send a token (tp login, TP_TOKEN) or sign in on the server's page")


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + status})
        return
    extra = [(b"www-authenticate", b'Bearer realm="training-platform"')] if status == 401 else []
    await _json(send, status, {"error": message}, extra)


async def _json(send: Send, status: int, answer: dict[str, Any], extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _html(send: Send, status: int, page: str) -> None:
    body = page.encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    headers.append((b"cache-control", b"no-store"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _body(receive: Receive, limit: int) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit or not message.get("more_body"):
            return body[:limit]


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    cookies = {}
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            cookies[name] = value
    return cookies


def _local_target(target: str) -> str:
    """TARGET if it is a path on this server; else "/" (a sign-in never sends a browser elsewhere)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _signin_page(target: str, error: str | None) -> str:
    problem = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in: training platform</title>
<style>body{{font-family:sans-serif;max-width:28em;margin:4em auto}}input{{width:100%;padding:.4em}}
.error{{color:#b00020}}</style></head>
<body><h1>Sign in</h1>
<p>Paste your platform token (an admin creates it with <code>tp admin token create</code>).</p>
{problem}
<form method="post" action="{SIGNIN_PATH}">
<input type="hidden" name="next" value="{html.escape(target)}">
<label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<p><button type="submit">Sign in</button></p>
</form></body></html>
"""
