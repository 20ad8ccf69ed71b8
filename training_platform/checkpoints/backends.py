"""Which storage a URI names: chosen here, above both backends.

``s3://bucket/prefix`` is S3 (s3.py, through boto3, imported only when asked for); a directory, as a path or
``file://``, is local disk (storage.py's LocalStorage, with the `Storage` protocol both keep).
"""

from __future__ import annotations

from pathlib import Path

from training_platform.checkpoints.storage import LocalStorage, Storage
from training_platform.errors import CheckpointError


def open_storage(uri: str | Path) -> Storage:
    """The storage a URI names: ``s3://bucket/prefix``, or a directory (a path, or ``file://``)."""
    text = str(uri)
    if text.startswith("s3://"):
        from training_platform.checkpoints.s3 import S3Storage  # boto3 only when asked for

        return S3Storage.from_uri(text)
    if "://" in text and not text.startswith("file://"):
        raise CheckpointError(f"unsupported storage URI {text!r}: use a directory or s3://bucket/prefix")
    return LocalStorage(Path(text.removeprefix("file://")))
