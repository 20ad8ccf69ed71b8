"""The spot notice watcher against a loopback server playing each cloud's metadata endpoint, and
against one that misbehaves: other schemes and hosts, redirects, endless bodies, slow drips."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training_platform.errors import SpecError
from training_platform.train.spot_notice import (
    HOSTS_ENV,
    MAX_BODY,
    SpotNoticeWatcher,
    check_notice_url,
    endpoint_for,
    notice_present,
)

RESPONSES = {
    # provider: (path, header that must be sent, body without notice, body with notice)
    "gcp": ("/computeMetadata/v1/instance/preempted", "Metadata-Flavor", b"FALSE", b"TRUE"),
    "azure": ("/metadata/scheduledevents", "Metadata", b'{"Events": []}', b'{"Events": [{"EventType": "Preempt"}]}'),
    # AWS answers 404 until a notice exists.
    "aws": ("/latest/meta-data/spot/instance-action", None, None, b'{"action": "terminate", "time": "2026-01-01"}'),
}


@pytest.fixture
def metadata_server(monkeypatch):
    monkeypatch.setenv(HOSTS_ENV, "127.0.0.1")  # the operator allows the test server's host
    state = {"notice": False, "provider": "gcp", "answer": None}

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - AWS IMDSv2 token
            self._send(200, b"token")

        def do_GET(self):  # noqa: N802 - http.server's naming
            if state["answer"]:
                return state["answer"](self)
            path, header, quiet, notice = RESPONSES[state["provider"]]
            ok = self.path.startswith(path) and (header is None or self.headers.get(header))
            body = (notice if state["notice"] else quiet) if ok else b""
            self._send(200 if ok and body is not None else 404, body or b"")

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize("provider", ["gcp", "azure", "aws"])
def test_notice_is_seen_only_once_announced(metadata_server, provider):
    state, base = metadata_server
    state["provider"] = provider
    endpoint = endpoint_for(provider, base + RESPONSES[provider][0] + "?api-version=2020-07-01")
    assert not notice_present(endpoint)
    state["notice"] = True
    assert notice_present(endpoint)


def test_watcher_calls_back_once_and_an_unreachable_endpoint_is_quiet(metadata_server):
    state, base = metadata_server
    fired = threading.Event()
    watcher = SpotNoticeWatcher(endpoint_for("gcp", base + RESPONSES["gcp"][0]), fired.set, poll_seconds=0.05)
    watcher.start()
    assert not fired.wait(0.3)
    state["notice"] = True
    assert fired.wait(5)
    watcher.stop()
    assert not notice_present(endpoint_for("aws", "http://127.0.0.1:9/latest/meta-data/spot/instance-action"))


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "https://169.254.169.254/latest/meta-data/spot/instance-action",
        "http://internal-db.example:5432/",
        "http://user:pw@169.254.169.254/latest/meta-data/spot/instance-action",
    ],
)
def test_only_http_to_the_providers_metadata_host_is_polled(monkeypatch, url):
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    with pytest.raises(SpecError, match="preemption.notice_url: only http:// to aws's metadata host"):
        endpoint_for("aws", url)
    check_notice_url("aws", "http://169.254.169.254/latest/meta-data/spot/instance-action")


def _redirect(handler):
    handler.send_response(302)
    handler.send_header("Location", "/latest/meta-data/spot/instance-action-elsewhere")
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _any_2xx(handler):
    handler._send(204, b"")


def _endless(handler):
    handler._send(200, b'{"action": "terminate", "time": "x", "pad": "' + b"x" * (MAX_BODY + 10) + b'"}')


@pytest.mark.parametrize("answer", [_redirect, _any_2xx, _endless], ids=["redirect", "2xx-alone", "huge-body"])
def test_a_redirect_a_bare_2xx_or_a_huge_body_is_no_aws_notice(metadata_server, answer):
    state, base = metadata_server
    state["answer"] = answer
    assert not notice_present(endpoint_for("aws", base + RESPONSES["aws"][0]))


def test_a_server_that_drips_its_answer_does_not_hold_the_poll_past_its_deadline(metadata_server):
    state, base = metadata_server
    stop = threading.Event()

    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        while not stop.wait(0.1):  # one byte every 0.1 s: each read alone is well inside any timeout
            handler.wfile.write(b" ")
            handler.wfile.flush()

    state["answer"] = drip
    started = time.monotonic()
    try:
        assert not notice_present(endpoint_for("gcp", base + RESPONSES["gcp"][0]), timeout=0.5)
    finally:
        stop.set()
    assert time.monotonic() - started < 1.5
