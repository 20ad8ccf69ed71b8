"""The S3 storages of one process share a boto3 client, unless their settings or credentials differ."""

from __future__ import annotations

import os

from training_platform.checkpoints.s3 import S3Storage


def test_stores_on_one_endpoint_share_a_client_built_once(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-one")
    one = S3Storage("bucket", "checkpoints", endpoint_url="http://127.0.0.1:9")
    two = S3Storage("other-bucket", "snapshots", endpoint_url="http://127.0.0.1:9")
    assert one.client is two.client
    assert S3Storage("bucket", endpoint_url="http://127.0.0.1:10").client is not one.client
    assert S3Storage("bucket", endpoint_url="http://127.0.0.1:9", max_attempts=2).client is not one.client


def test_a_changed_credential_gets_a_client_that_signs_with_it(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-one")
    before = S3Storage("bucket", endpoint_url="http://127.0.0.1:9").client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    after = S3Storage("bucket", endpoint_url="http://127.0.0.1:9").client
    assert after is not before
    assert after._request_signer._credentials.access_key == "second"
    assert before._request_signer._credentials.access_key == "first"


def test_a_forked_child_builds_its_own_client(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-one")
    parent = S3Storage("bucket", endpoint_url="http://127.0.0.1:9").client
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: 1 when it got the parent's client, 0 when its own
        os.write(write, b"1" if S3Storage("bucket", endpoint_url="http://127.0.0.1:9").client is parent else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"0"
