"""Watch the cloud's instance metadata for a spot interruption notice, before SIGTERM arrives.

AWS gives two minutes' notice, GCP and Azure about 30 seconds: enough for an emergency checkpoint
if the worker starts on the notice instead of on the signal. The watcher turns a notice into the
same path as SIGTERM (``TrainingSession.should_stop``).

The URL comes from a user's spec, so the poller trusts little: plain http to the provider's
metadata host only (``TP_SPOT_NOTICE_HOSTS`` adds hosts, e.g. a test server), no redirects, a
capped body, one deadline for the whole poll, and a notice only when the body says so.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from training_platform.errors import SpecError

HOSTS_ENV = "TP_SPOT_NOTICE_HOSTS"
MAX_BODY = 64 * 1024  # an AWS instance-action document is ~60 bytes; Azure's events a few KiB
AWS_ACTIONS = ("stop", "terminate", "hibernate")


@dataclass(frozen=True)
class NoticeEndpoint:
    url: str
    provider: str
    headers: dict[str, str] = field(default_factory=dict)
    token_url: str | None = None  # AWS IMDSv2 session token


AWS_BASE = "http://169.254.169.254/latest"
PROVIDERS: dict[str, NoticeEndpoint] = {
    "aws": NoticeEndpoint(f"{AWS_BASE}/meta-data/spot/instance-action", "aws", token_url=f"{AWS_BASE}/api/token"),
    "gcp": NoticeEndpoint(
        "http://metadata.google.internal/computeMetadata/v1/instance/preempted", "gcp", {"Metadata-Flavor": "Google"}
    ),
    "azure": NoticeEndpoint(
        "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01", "azure", {"Metadata": "true"}
    ),
}
METADATA_HOSTS = {"aws": {"169.254.169.254"}, "gcp": {"metadata.google.internal", "169.254.169.254"}}
METADATA_HOSTS["azure"] = METADATA_HOSTS["aws"]


def check_notice_url(provider: str, url: str, environ: Mapping[str, str] | None = None) -> None:
    """A SpecError unless `url` is plain http to the provider's metadata host (or one of TP_SPOT_NOTICE_HOSTS)."""
    environ = os.environ if environ is None else environ
    extra = {host.strip() for host in environ.get(HOSTS_ENV, "").split(",") if host.strip()}
    allowed = METADATA_HOSTS.get(provider, set()) | extra
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in allowed or parts.username or parts.password:
        raise SpecError(
            f"preemption.notice_url: only http:// to {provider}'s metadata host is polled "
            f"({', '.join(sorted(allowed))}); remove notice_url or ask the operator to add the host to {HOSTS_ENV}"
        )


def endpoint_for(provider: str, url: str | None = None) -> NoticeEndpoint:
    """The provider's endpoint; `url` replaces its address (tests, proxies), if the host is allowed."""
    base = PROVIDERS[provider]
    if url is None:
        return base
    check_notice_url(provider, url)
    token_url = url.rsplit("/meta-data/", 1)[0] + "/api/token" if base.token_url and "/meta-data/" in url else None
    return NoticeEndpoint(url, provider, base.headers, token_url)


def notice_present(endpoint: NoticeEndpoint, timeout: float = 1.0) -> bool:
    """Whether the metadata service announces an interruption now; any doubt (no answer, a redirect,
    a body too long or not the provider's notice) is no notice. `timeout` bounds the whole poll."""
    deadline = time.monotonic() + timeout
    headers = dict(endpoint.headers)
    if endpoint.token_url:
        token = _get(endpoint.token_url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, deadline)
        if token:
            headers["X-aws-ec2-metadata-token"] = token
    body = _get(endpoint.url, "GET", headers, deadline)
    return body is not None and _is_notice(endpoint.provider, body)


def _is_notice(provider: str, body: str) -> bool:
    if provider == "gcp":
        return body.strip() == "TRUE"
    try:
        document = json.loads(body)
    except ValueError:
        return False
    if provider == "aws":  # {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
        return isinstance(document, dict) and document.get("action") in AWS_ACTIONS and "time" in document
    events = document.get("Events") if isinstance(document, dict) else None
    return isinstance(events, list) and any(isinstance(e, dict) and e.get("EventType") == "Preempt" for e in events)


def _get(url: str, method: str, headers: dict[str, str], deadline: float) -> str | None:
    """The body of a 200 answer read before `deadline`, at most MAX_BODY bytes; else None."""
    parts = urlsplit(url)
    remaining = deadline - time.monotonic()
    if parts.scheme != "http" or not parts.hostname or remaining <= 0:
        return None
    path = parts.path or "/"
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=remaining)
    try:
        connection.request(method, path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        sock = connection.sock  # the response may take it over; each read below gets what time is left
        response = connection.getresponse()  # http.client never follows a redirect
        if response.status != 200:
            return None
        body = b""
        while len(body) <= MAX_BODY:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None  # a server that drips its answer does not hold the poll past the deadline
            sock.settimeout(remaining)
            chunk = response.read1(MAX_BODY + 1 - len(body))
            if not chunk:
                return body.decode(errors="replace")
            body += chunk
        return None  # longer than any notice
    except (OSError, http.client.HTTPException):
        return None  # no metadata service, or it misbehaved: nothing to act on
    finally:
        connection.close()


class SpotNoticeWatcher:
    """Polls the endpoint in a daemon thread and calls `on_notice` once when a notice appears."""

    def __init__(self, endpoint: NoticeEndpoint, on_notice: Callable[[], None], poll_seconds: float = 5.0):
        self.endpoint = endpoint
        self.on_notice = on_notice
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-notice-watcher", daemon=True)

    def start(self) -> SpotNoticeWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if notice_present(self.endpoint, timeout=min(1.0, self.poll_seconds)):
                self.on_notice()
                return
            self._stop.wait(self.poll_seconds)
