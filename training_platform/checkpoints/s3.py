"""S3 tier: any S3-compatible server through boto3, multipart via the transfer manager.

Credentials come only from the environment (the boto3 default chain); they are never put
in a URI, a manifest or a log line. The endpoint is ``TP_S3_ENDPOINT_URL`` or
``AWS_ENDPOINT_URL`` when set, else AWS. A PUT (or a completed multipart upload) is atomic
on S3, so an object is either absent or whole; the store writes the manifest object last.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Callable
from urllib.parse import parse_qs, urlparse

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from training_platform.checkpoints.copying import copy_bytes
from training_platform.checkpoints.storage import Buffer, NotWanted, ObjectInfo, validate_key
from training_platform.errors import CheckpointError

# Objects above this go up in parallel parts; our chunks are 64 MiB, so 4 parts each.
MULTIPART_BYTES = 16 << 20
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


def endpoint_from_env() -> str | None:
    return os.environ.get("TP_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def shared_client(endpoint_url: str | None, region: str, max_attempts: int, max_pool_connections: int):
    """One boto3 client per process, endpoint, settings and credentials in the environment.

    Building a client loads botocore's endpoint and service models: about 0.1 s of CPU, and a pipeline opened a
    store a dozen times. Clients are thread-safe; a forked child builds its own (its parent's connections are
    not its to use). Keyed by a digest of the AWS_* settings, so a changed credential gets a new client.
    """
    credentials = hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))).encode())
    key = (os.getpid(), endpoint_url, region, max_attempts, max_pool_connections, credentials.hexdigest())
    with _clients_lock:  # a boto3 session builds clients one thread at a time
        if key not in _clients:
            config = Config(
                retries={"max_attempts": max_attempts, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                max_pool_connections=max_pool_connections,
                region_name=region,
            )
            _clients[key] = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        return _clients[key]


class S3Storage:
    """Objects under ``s3://bucket/prefix``; retries with exponential backoff (botocore standard mode)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        storage_class: str | None = None,
        max_attempts: int = 8,
        concurrency: int = 8,
    ):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        self.endpoint_url = endpoint_url or endpoint_from_env()
        self.storage_class = storage_class
        self.max_attempts = max_attempts
        self.concurrency = concurrency
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.client = shared_client(self.endpoint_url, region, max_attempts, 4 * concurrency)
        self.transfer_config = TransferConfig(
            multipart_threshold=MULTIPART_BYTES,
            multipart_chunksize=MULTIPART_BYTES,
            max_concurrency=concurrency,
            use_threads=True,
        )
        self._manager = create_transfer_manager(self.client, self.transfer_config)

    @classmethod
    def from_uri(cls, uri: str) -> S3Storage:
        """``s3://bucket/prefix[?storage_class=STANDARD_IA]``."""
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise CheckpointError(f"not an S3 URI: {uri!r}; use s3://bucket/prefix")
        query = parse_qs(parsed.query)
        storage_class = query.get("storage_class", [None])[0]
        return cls(parsed.netloc, parsed.path, storage_class=storage_class)

    def __reduce__(self):
        # Rebuilt in the background writer process from the same environment (credentials stay there).
        return (
            _rebuild,
            (self.bucket, self.prefix, self.endpoint_url, self.storage_class, self.max_attempts),
        )

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r})"

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, exc: Exception) -> CheckpointError:
        if isinstance(exc, ClientError) and _code(exc) in _DENIED:
            return CheckpointError(
                f"S3 {action} of {self.uri}/{key} was denied ({_code(exc)}): the credentials in this environment "
                "may not do it; grant them access to the bucket, or use credentials that have it"
            )
        return CheckpointError(
            f"S3 {action} of {self.uri}/{key} failed after {self.max_attempts} attempts: {exc}. "
            "Check that the S3 endpoint is reachable and the bucket exists."
        )

    def put(
        self, key: str, data: Buffer, *, sync_parent: bool = True, visible_if: Callable[[], bool] | None = None
    ) -> None:
        """A PUT is what makes an object visible: `visible_if` is asked right before it (LocalStorage.put)."""
        if visible_if is not None and not visible_if():
            raise NotWanted(f"{self.uri}/{key} was not wanted any more")
        view = memoryview(data).cast("B")
        extra = {"StorageClass": self.storage_class} if self.storage_class else {}
        try:
            if len(view) < MULTIPART_BYTES:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(view), **extra)
            else:
                self._manager.upload(_ReadableView(view), self.bucket, self._key(key), extra_args=extra).result()
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("upload", key, exc) from None

    def upload_file(self, key: str, path: str) -> None:
        """Upload a local file (used for DCP shards and tiering), multipart when large."""
        extra = {"StorageClass": self.storage_class} if self.storage_class else {}
        try:
            self._manager.upload(path, self.bucket, self._key(key), extra_args=extra).result()
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("upload", key, exc) from None

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise FileNotFoundError(f"{self.uri}/{key}") from None
            raise self._fail("download", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("download", key, exc) from None

    def get_into(self, key: str, out: memoryview) -> int:
        """Download into `out` with parallel ranged GETs; returns the object's size."""
        sink = _WritableView(memoryview(out).cast("B"))
        try:
            self._manager.download(self.bucket, self._key(key), sink).result()
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise FileNotFoundError(f"{self.uri}/{key}") from None
            raise self._fail("download", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("download", key, exc) from None
        return sink.high_water

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return False
            raise self._fail("lookup", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("lookup", key, exc) from None

    def stat(self, key: str) -> ObjectInfo | None:
        """Size and LastModified (by the server's clock), or None when absent."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return None
            raise self._fail("lookup", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("lookup", key, exc) from None
        return ObjectInfo(key, head["ContentLength"], head["LastModified"].timestamp())

    def move(self, key: str, target: str) -> None:
        """Server-side copy, then delete (S3 has no rename); FileNotFoundError when it is gone."""
        source = {"Bucket": self.bucket, "Key": self._key(key)}
        try:
            self._manager.copy(source, self.bucket, self._key(target)).result()
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise FileNotFoundError(f"{self.uri}/{key}") from None
            raise self._fail("copy", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("copy", key, exc) from None
        self.delete(key)

    def list(self, prefix: str) -> list[str]:
        return [info.key for info in self.list_info(prefix)]

    def list_info(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix` (under the whole store for "")."""
        base = self._key(prefix.rstrip("/")) + "/" if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        infos = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                for item in page.get("Contents", []):
                    infos.append(ObjectInfo(item["Key"][strip:], item["Size"], item["LastModified"].timestamp()))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("listing", prefix, exc) from None
        return sorted(infos, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("delete", key, exc) from None

    def sync(self, prefix: str) -> None:
        """Nothing to do: a completed PUT is durable on S3."""

    def storage_class_of(self, key: str) -> str:
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return head.get("StorageClass", "STANDARD")


def _rebuild(bucket, prefix, endpoint_url, storage_class, max_attempts) -> S3Storage:
    return S3Storage(bucket, prefix, endpoint_url=endpoint_url, storage_class=storage_class, max_attempts=max_attempts)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class _ReadableView(io.RawIOBase):
    """A seekable read-only file over a memoryview, so uploads read tensors without copying them first."""

    def __init__(self, view: memoryview):
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        piece = self._view[self._pos : self._pos + len(buffer)]
        copy_bytes(memoryview(buffer).cast("B")[: len(piece)], piece)  # in a training process's thread too
        self._pos += len(piece)
        return len(piece)

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = self._view[self._pos : end].tobytes()
        self._pos = end
        return data


class _WritableView(io.RawIOBase):
    """A seekable write-only file over a memoryview: ranged downloads land in place."""

    def __init__(self, view: memoryview):
        self._view = view
        self._pos = 0
        self.high_water = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.high_water}[whence]
        self._pos = base + offset
        return self._pos

    def write(self, data) -> int:
        piece = memoryview(data).cast("B")
        end = self._pos + len(piece)
        if end > len(self._view):
            raise ValueError(f"object is larger than the {len(self._view)} bytes expected")
        self._view[self._pos : end] = piece
        self._pos = end
        self.high_water = max(self.high_water, end)
        return len(piece)
