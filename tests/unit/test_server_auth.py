"""The server's authentication (server/auth.py) in front of a stand-in app: who is served, who is refused, and how."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlencode

import pytest

from training_platform.server.auth import SESSION_COOKIE, SIGNOUT_PATH, USER_SCOPE_KEY, Authenticate

TOKENS = {"tp_alice": "alice"}
HOST = "127.0.0.1:3000"


async def _app(scope, receive, send):
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    if scope["path"] == "/page":  # an HTML page, sent in two parts as a streaming app may
        page = b"<html><body><div id=app></div></body></html>"
        headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(page)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": page[:20], "more_body": True})
        await send({"type": "http.response.body", "body": page[20:]})
        return
    body = json.dumps({"user": scope.get(USER_SCOPE_KEY), "path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _call(method="GET", path="/graphql", query="", headers=(), body=b"", kind="http"):
    scope = {
        "type": kind, "method": method, "path": path, "query_string": query.encode(), "scheme": "http",
        "headers": [(b"host", HOST.encode()), *((k.encode(), v.encode()) for k, v in headers)],
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(Authenticate(_app, TOKENS.get)(scope, receive, send))
    if kind == "websocket":
        return sent[0]
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, payload


JSON = ("content-type", "application/json")


def test_a_request_without_a_token_is_refused_and_a_valid_token_is_served_as_its_user():
    status, headers, body = _call("POST", headers=[JSON], body=b"{}")
    assert status == 401 and "www-authenticate" in headers and b"tp login" in body
    assert _call("POST", headers=[JSON, ("authorization", "Bearer tp_wrong")])[0] == 401
    status, _, body = _call("POST", headers=[JSON, ("authorization", "Bearer tp_alice")], body=b"{}")
    assert status == 200 and json.loads(body)["user"] == "alice"


def test_a_browser_without_a_session_goes_to_the_sign_in_page_and_back():
    status, headers, _ = _call("GET", "/runs", query="tab=all", headers=[("accept", "text/html")])
    assert status == 303 and headers["location"] == "/signin?next=%2Fruns%3Ftab%3Dall"
    status, _, page = _call("GET", "/signin", query="next=/runs")
    assert status == 200 and b'name="token"' in page and b'value="/runs"' in page


def test_signing_in_sets_a_strict_http_only_cookie_that_then_serves_the_browser():
    form = urlencode({"token": "tp_alice", "next": "/runs"}).encode()
    status, headers, _ = _call("POST", "/signin", headers=[("origin", f"http://{HOST}")], body=form)
    assert status == 303 and headers["location"] == "/runs"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=tp_alice;") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, body = _call("GET", "/runs", headers=[("cookie", f"{SESSION_COOKIE}=tp_alice")])
    assert status == 200 and json.loads(body)["user"] == "alice"
    bad = urlencode({"token": "tp_nope"}).encode()
    status, _, page = _call("POST", "/signin", body=bad)
    assert status == 401 and b"not valid" in page
    elsewhere = urlencode({"token": "tp_alice", "next": "https://evil.example/"}).encode()
    assert _call("POST", "/signin", body=elsewhere)[1]["location"] == "/"  # never sent off the server


@pytest.mark.parametrize("origin", ["http://evil.example", None])
def test_a_cookie_cannot_carry_a_change_from_another_origin(origin):
    headers = [JSON, ("cookie", f"{SESSION_COOKIE}=tp_alice")] + ([("origin", origin)] if origin else [])
    status, _, body = _call("POST", headers=headers, body=b"{}")
    assert status == 403 and b"Origin" in body
    same = [JSON, ("cookie", f"{SESSION_COOKIE}=tp_alice"), ("origin", f"http://{HOST}")]
    assert _call("POST", headers=same, body=b"{}")[0] == 200
    bearer = [JSON, ("authorization", "Bearer tp_alice"), ("origin", "http://evil.example")]
    assert _call("POST", headers=bearer)[0] == 200  # a bearer token is no browser's ambient credential


def test_a_mutation_is_refused_as_a_get_or_as_a_form_and_a_query_get_is_served():
    bearer = ("authorization", "Bearer tp_alice")
    add = 'mutation { addDynamicPartition(partitionsDefName: "x", partitionKey: "y") { __typename } }'
    mutation = urlencode({"query": add})
    assert _call("GET", query=mutation, headers=[bearer])[0] == 405
    assert _call("GET", query=urlencode({"query": "{ version"}), headers=[bearer])[0] == 405  # unparsable: refused
    assert _call("GET", query=urlencode({"query": "{ version }"}), headers=[bearer])[0] == 200
    status, _, body = _call("POST", headers=[bearer, ("content-type", "text/plain")], body=b"{}")
    assert status == 415 and b"application/json" in body


def test_only_liveness_and_the_sign_in_page_are_open():
    assert _call("GET", "/server_info")[0] == 200
    assert _call("POST", "/server_info")[0] == 401
    assert _call("GET", "/graphql")[0] == 401


def test_a_websocket_needs_a_token_and_with_the_cookie_the_servers_origin():
    assert _call(path="/graphql", kind="websocket") == {"type": "websocket.close", "code": 4401}
    cookie = ("cookie", f"{SESSION_COOKIE}=tp_alice")
    assert _call(path="/graphql", kind="websocket", headers=[cookie, ("origin", "http://evil.example")])["code"] == 4403
    accepted = _call(path="/graphql", kind="websocket", headers=[cookie, ("origin", f"http://{HOST}")])
    assert accepted == {"type": "websocket.accept"}


def test_a_page_shows_who_is_signed_in_with_a_sign_out_button_and_an_api_answer_is_left_alone():
    cookie = ("cookie", f"{SESSION_COOKIE}=tp_alice")
    status, headers, body = _call("GET", "/page", headers=[cookie, ("accept", "text/html")])
    assert status == 200 and int(headers["content-length"]) == len(body)
    assert body.startswith(b"<html><body><div id=app></div>") and body.endswith(b"</body></html>")
    assert b"signed in as <b>alice</b>" in body and f'action="{SIGNOUT_PATH}"'.encode() in body
    _, _, answer = _call("GET", "/graphql", query="query={__typename}", headers=[cookie])
    assert json.loads(answer) == {"user": "alice", "path": "/graphql"}


def test_sign_out_clears_the_cookie_only_from_the_servers_own_page():
    own, other = ("origin", f"http://{HOST}"), ("origin", "http://evil.example")
    status, headers, _ = _call("POST", SIGNOUT_PATH, headers=[own, ("cookie", f"{SESSION_COOKIE}=tp_alice")])
    assert status == 303 and headers["location"] == "/signin"
    assert headers["set-cookie"].startswith(f"{SESSION_COOKIE}=;") and "Max-Age=0" in headers["set-cookie"]
    assert _call("POST", SIGNOUT_PATH, headers=[other])[0] == 403  # another site cannot sign a user out
    assert _call("GET", SIGNOUT_PATH, headers=[own])[0] == 403
