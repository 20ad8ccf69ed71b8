"""Manifests are signed with the deployment's key, so that writing to a store is not enough to
choose what a run restores.

A manifest's sha256 covers only the manifest itself: anyone who can write the store can make one
that matches. Its signature is an HMAC-SHA256 of that content hash under the deployment's key;
restore refuses a manifest that is unsigned, signed with another key, or edited after signing.
The key comes from ``TP_CHECKPOINT_SIGNING_KEY`` (hex, at least 32 bytes: clusters set it from a
secret, for the orchestrator and every job); without it, the embedded default makes one once under
the platform home (mode 0600), which local jobs read through ``TP_HOME``.

Jobs hold the key (they sign their own saves), so a signature says "written by this deployment",
not "written by harmless code": what reads checkpoints still unpickles nothing (see sharded.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from training_platform.errors import CheckpointError
from training_platform.paths import PlatformHome

if TYPE_CHECKING:
    from training_platform.checkpoints.manifest import CheckpointManifest

SIGNING_KEY_ENV = "TP_CHECKPOINT_SIGNING_KEY"
KEY_FILE = "checkpoint-signing.key"
MIN_KEY_BYTES = 32
_SCHEME = "hmac-sha256"


@dataclass(frozen=True)
class ManifestSigner:
    """Signs and verifies manifests with one deployment key (never shown: not in its repr)."""

    key: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """Names the key in signatures and messages without revealing it."""
        return hashlib.sha256(b"tp-checkpoint-key-id\0" + self.key).hexdigest()[:16]

    def signature_for(self, content_hash: str) -> str:
        mac = hmac.new(self.key, b"tp-checkpoint-manifest-v1\0" + content_hash.encode(), hashlib.sha256)
        return f"{_SCHEME}:{self.key_id}:{mac.hexdigest()}"

    def seal(self, manifest: CheckpointManifest) -> CheckpointManifest:
        """The manifest with its sha256 and its signature (the content is hashed once, for both)."""
        digest = manifest.content_hash()
        return manifest.model_copy(update={"manifest_sha256": digest, "signature": self.signature_for(digest)})

    def verify(self, manifest: CheckpointManifest) -> None:
        """Raise CheckpointError unless the manifest is signed with this key and unchanged since."""
        if not manifest.signature:
            raise CheckpointError(
                f"manifest {manifest.uri} is not signed: only manifests signed with the deployment's key "
                f"({SIGNING_KEY_ENV}) are restored. One written before signing can be signed once checked "
                "(README: 'Signed manifests')"
            )
        scheme, _, rest = manifest.signature.partition(":")
        key_id = rest.partition(":")[0]
        if scheme == _SCHEME and key_id != self.key_id:
            raise CheckpointError(
                f"manifest {manifest.uri} is signed with another key (id {key_id}; this deployment's is "
                f"{self.key_id}): set {SIGNING_KEY_ENV} to the key of the deployment that wrote it"
            )
        if not hmac.compare_digest(manifest.signature, self.signature_for(manifest.content_hash())):
            raise CheckpointError(f"manifest {manifest.uri} does not match its signature (edited after it was signed)")


def deployment_signer() -> ManifestSigner:
    """The key in TP_CHECKPOINT_SIGNING_KEY, else the platform home's key file (made once)."""
    value = os.environ.get(SIGNING_KEY_ENV)
    if value is not None:
        return ManifestSigner(_parse_key(value, SIGNING_KEY_ENV))
    return ManifestSigner(_home_key(PlatformHome.from_env().root / KEY_FILE))


def _parse_key(text: str, source: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        # The value is a secret: the message says what is wrong with it, never what it is.
        raise CheckpointError(
            f"{source} must be at least {2 * MIN_KEY_BYTES} hex digits ({MIN_KEY_BYTES} bytes); make one with "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return key


def _home_key(path: Path) -> bytes:
    """Read the key file, refusing one that others could read or that another user made; create it
    when missing (a complete file appears at once, so concurrent starters agree on one key)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(MIN_KEY_BYTES) + "\n")
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(draft, path)
        draft.unlink()
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise CheckpointError(
            f"checkpoint signing key {path} belongs to another user: remove it, or set {SIGNING_KEY_ENV}"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise CheckpointError(f"checkpoint signing key {path} is readable by others: run `chmod 600 {path}`")
    return _parse_key(path.read_text(), str(path))
