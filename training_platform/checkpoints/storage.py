"""Byte storage under a checkpoint store: keys are relative, validated paths.

A storage writes each object atomically: a reader sees either nothing or the whole object.
This module imports no torch, so the background writer process starts quickly.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Protocol

from training_platform.checkpoints.direct_io import AlignedAppender, open_for_append
from training_platform.errors import CheckpointError

_KEY_PART = re.compile(r"^[A-Za-z0-9_.=-]+$")
# Large writes go out in pieces this size: big enough for full disk bandwidth, small enough
# that a slice of a memoryview never needs a second copy.
_WRITE_BLOCK = 8 << 20

Buffer = bytes | bytearray | memoryview


def validate_key(key: str) -> str:
    """Refuse keys that could escape the store: absolute paths, '..', empty or odd parts."""
    parts = key.split("/")
    if key.startswith("/") or any(p in ("", ".", "..") or not _KEY_PART.match(p) for p in parts):
        raise ValueError(
            f"invalid storage key {key!r}: use relative paths of letters, digits, '_', '-', '.', '=' "
            "with no '..' or empty parts"
        )
    return key


class NotWanted(CheckpointError):
    """A put whose `visible_if` said no: nothing was made visible."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch, as the storage reports it


class Storage(Protocol):
    """What a checkpoint store needs from a tier: atomic puts, whole-object gets, listing."""

    uri: str

    def put(
        self, key: str, data: Buffer, *, sync_parent: bool = True, visible_if: Callable[[], bool] | None = None
    ) -> None: ...

    def get(self, key: str) -> bytes: ...

    def get_into(self, key: str, out: memoryview) -> int: ...

    def exists(self, key: str) -> bool: ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def move(self, key: str, target: str) -> None: ...

    def list(self, prefix: str) -> list[str]: ...

    def list_info(self, prefix: str) -> list[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...

    def sync(self, prefix: str) -> None: ...


class LocalStorage:
    """A directory on a local (or network) filesystem; atomic by write-to-temp, fsync, rename."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.uri = str(self.root)

    def __reduce__(self):
        return (LocalStorage, (self.root,))

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def put(
        self, key: str, data: Buffer, *, sync_parent: bool = True, visible_if: Callable[[], bool] | None = None
    ) -> None:
        """Write to a temporary name, fsync, rename; `sync_parent=False` defers the dir fsync to sync().

        `visible_if`: asked once the bytes are durable, right before the rename makes them visible; False leaves
        nothing behind and raises NotWanted (a manifest whose trainer died during its fsync is not published).
        """
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                written = os.write(fd, view[:_WRITE_BLOCK])
                view = view[written:]
            os.fsync(fd)
            if visible_if is not None and not visible_if():
                raise NotWanted(f"{self.uri}/{key} was not wanted any more once written")
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, path)
        if sync_parent:
            _fsync_dir(path.parent)

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_into(self, key: str, out: memoryview) -> int:
        """Read the whole object into `out` without an intermediate copy; returns its size."""
        with open(self._path(key), "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > len(out):
                raise ValueError(f"{key} is {size} bytes, larger than the {len(out)} expected")
            done = 0
            while done < size:
                got = handle.readinto(out[done : min(size, done + _WRITE_BLOCK)])
                if not got:
                    break
                done += got
            return done

    def get_range(self, key: str, offset: int, out: memoryview) -> None:
        """Fill `out` with the object's bytes from `offset`; ValueError when the object ends first."""
        fd = os.open(self._path(key), os.O_RDONLY)
        try:
            done = 0
            while done < len(out):
                got = os.preadv(fd, [out[done : done + _WRITE_BLOCK]], offset + done)
                if not got:
                    raise ValueError(f"{key} ends at byte {offset + done}, before the {len(out)} bytes from {offset}")
                done += got
        finally:
            os.close(fd)

    def open_append(self, key: str) -> AppendedObject:
        """An object written by appending, visible under `key` (durably) only once committed."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return AppendedObject(path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def stat(self, key: str) -> ObjectInfo | None:
        """Size and modification time (by the filesystem's clock), or None when absent."""
        try:
            info = self._path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, info.st_size, info.st_mtime)

    def move(self, key: str, target: str) -> None:
        """Rename an object (atomic); FileNotFoundError when it is gone."""
        path = self._path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(key), path)
        _fsync_dir(path.parent)

    def list(self, prefix: str) -> list[str]:
        return [info.key for info in self.list_info(prefix)]

    def list_info(self, prefix: str) -> list[ObjectInfo]:
        """Every file under PREFIX but the hidden ones (a write's temporary file). One stat per file, by scandir:
        GC lists every chunk of a store on each collection, and pathlib's rglob, stat and is_file took 3 of them."""
        root = str(self.root) + os.sep
        infos = []
        pending = [str(self._path(prefix.rstrip("/")))]
        while pending:
            try:
                entries = os.scandir(pending.pop())
            except (FileNotFoundError, NotADirectoryError):  # no such prefix, or deleted while listing
                continue
            with entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                            continue
                        if entry.name.startswith("."):
                            continue
                        stat = entry.stat()
                    except FileNotFoundError:  # deleted while listing (GC, prune)
                        continue
                    if S_ISREG(stat.st_mode):
                        infos.append(ObjectInfo(entry.path.removeprefix(root), stat.st_size, stat.st_mtime))
        return sorted(infos, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def remove_stale_temporaries(self, older_than_seconds: float, *, now: float | None = None) -> int:
        """Delete temporary files left by writers killed mid-put; returns how many.

        `now`: the filesystem's clock (GC reads it; see retention.storage_now), else this machine's.
        """
        removed = 0
        cutoff = (time.time() if now is None else now) - older_than_seconds
        for path in self.root.rglob(".*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def sync(self, prefix: str) -> None:
        """Make renames under `prefix` durable (puts made with sync_parent=False)."""
        path = self._path(prefix.rstrip("/"))
        if path.is_dir():
            _fsync_dir(path)


class AppendedObject:
    """A file written at a temporary name (which GC's stale-temporary sweep removes if its writer dies), past the
    page cache where the filesystem allows (direct_io.py): a pack is a save's bulk."""

    def __init__(self, path: Path):
        self.path = path
        self._tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        self._fd = open_for_append(self._tmp)
        self._appender = AlignedAppender(self._fd)
        self.size = 0

    @property
    def direct(self) -> bool:
        """Written with O_DIRECT (until commit)."""
        return self._appender.direct

    def append(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self._appender.append(view)
        self.size += len(view)

    def commit(self) -> None:
        """Write the rest, fsync and rename into place; the directory's fsync is the caller's (Storage.sync)."""
        try:
            self._appender.finish(self.size)
            os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = -1
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._fd >= 0:
            self._appender.close()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self._tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
