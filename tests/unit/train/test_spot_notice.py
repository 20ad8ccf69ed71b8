"""The spot notice watcher against a loopback server playing each cloud's metadata endpoint."""

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from training_platform.train.spot_notice import SpotNoticeWatcher, endpoint_for, notice_present

RESPONSES = {
    # provider: (path, header that must be sent, body without notice, body with notice)
    "gcp": ("/computeMetadata/v1/instance/preempted", "Metadata-Flavor", b"FALSE", b"TRUE"),
    "azure": ("/metadata/scheduledevents", "Metadata", b'{"Events": []}', b'{"Events": [{"EventType": "Preempt"}]}'),
}


@pytest.fixture
def metadata_server():
    state = {"notice": False, "provider": "gcp"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            path, header, quiet, notice = RESPONSES[state["provider"]]
            ok = self.path.startswith(path) and self.headers.get(header)
            body = (notice if state["notice"] else quiet) if ok else b""
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize("provider", ["gcp", "azure"])
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
