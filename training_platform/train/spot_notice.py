"""Watch the cloud's instance metadata for a spot interruption notice, before SIGTERM arrives.

AWS gives two minutes' notice, GCP and Azure about 30 seconds: enough for an emergency checkpoint
if the worker starts on the notice instead of on the signal. The watcher turns a notice into the
same path as SIGTERM (``TrainingSession.should_stop``).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NoticeEndpoint:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    # AWS answers 404 until a notice exists; GCP answers "TRUE"; Azure lists a "Preempt" event.
    marker: str | None = None
    token_url: str | None = None  # AWS IMDSv2 session token


AWS_BASE = "http://169.254.169.254/latest"
PROVIDERS: dict[str, NoticeEndpoint] = {
    "aws": NoticeEndpoint(f"{AWS_BASE}/meta-data/spot/instance-action", token_url=f"{AWS_BASE}/api/token"),
    "gcp": NoticeEndpoint(
        "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
        {"Metadata-Flavor": "Google"},
        marker="TRUE",
    ),
    "azure": NoticeEndpoint(
        "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
        {"Metadata": "true"},
        marker='"Preempt"',
    ),
}


def endpoint_for(provider: str, url: str | None = None) -> NoticeEndpoint:
    """The provider's endpoint; `url` replaces its address (tests, proxies, other clouds)."""
    base = PROVIDERS[provider]
    if url is None:
        return base
    token_url = url.rsplit("/meta-data/", 1)[0] + "/api/token" if base.token_url and "/meta-data/" in url else None
    return NoticeEndpoint(url, base.headers, base.marker, token_url)


def notice_present(endpoint: NoticeEndpoint, timeout: float = 1.0) -> bool:
    headers = dict(endpoint.headers)
    if endpoint.token_url:
        token = _imds_token(endpoint.token_url, timeout)
        if token:
            headers["X-aws-ec2-metadata-token"] = token
    request = urllib.request.Request(endpoint.url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return False  # 404 (no notice), or no metadata service: nothing to act on
    return endpoint.marker is None or endpoint.marker in body


def _imds_token(url: str, timeout: float) -> str | None:
    request = urllib.request.Request(url, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return None


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
