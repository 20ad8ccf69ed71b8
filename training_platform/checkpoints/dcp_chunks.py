"""DCP's files written straight into the store's chunks: no staging directory, no second write and read of a shard.

torch.distributed.checkpoint's FileSystemWriter writes a rank's shard as files through a small filesystem
interface. `ChunkedFiles` is that interface over the store: it cuts every file into pieces as DCP writes it, at
the offsets `write_chunks` cuts a staged file (CHUNK_BYTES apart, so a file's chunks are the same either way),
and hands each piece to the store's chunk sink (hash, deduplicate, write durably, at the save's pace), a few
pieces in flight at once. A file is then its list of chunks (`files`), which the manifest lists as before.

Measured before (0.5 GB of tensors in one process): DCP's writing of its staging files took as long as storing
them as chunks afterwards (0.44-0.57 s against 0.48-0.54 s), all of it at once when a save began, unpaced.

Pieces are gathered in buffers kept between saves (`_Buffers`): fresh memory costs a page fault per 4 KiB, and on
this machine copying 0.5 GB into fresh buffers took 0.41 s of CPU against 0.07 s into buffers used before.

Restoring, `StoredFiles` is the same interface for reading: DCP reads a file's items from its chunks, fetched and
verified as DCP comes to them (the next few fetched meanwhile), so a rank reads only the chunks holding its part of
the state, and nothing is written out first.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import threading
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from training_platform.checkpoints.copying import copy_bytes
from training_platform.checkpoints.manifest import ChunkRef, FileRef
from training_platform.checkpoints.reader import READ_WORKERS, ChunkReader
from training_platform.checkpoints.storage import Buffer
from training_platform.checkpoints.writer import CHUNK_BYTES, WRITE_WORKERS, ChunkSink
from training_platform.errors import CheckpointError


class _NamedFiles(FileSystemBase):
    """DCP's filesystem interface over `files`, a checkpoint's files by name (no directories: DCP's path is "")."""

    files: dict[str, FileRef]
    _pool: ThreadPoolExecutor

    def close(self) -> None:
        """Once DCP is done (its files are finished or read): stops the threads, dropping chunks read ahead."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{path}/{suffix}" if str(path) else suffix

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # never chosen by DCP for a checkpoint id: save_sharded and load_sharded hand it over

    def exists(self, path: str | os.PathLike) -> bool:
        return str(path) in self.files


class ChunkedFiles(_NamedFiles):
    """DCP's files as chunks of the store, by name (`files`, once DCP has closed them). One save's worth: make
    a new one per save, and `close` it after (waits for nothing: every file was finished as DCP closed it)."""

    def __init__(self, sink: ChunkSink, workers: int = WRITE_WORKERS):
        self.sink = sink
        self.files: dict[str, FileRef] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tp-ckpt-write")
        # Each piece in flight holds a buffer of CHUNK_BYTES: as many as there are workers, and one being filled.
        self._slots = threading.BoundedSemaphore(workers)

    def writer(self) -> FileSystemWriter:
        """A DCP storage writer whose files are these (one file per rank, as save_sharded always wrote them)."""
        writer = FileSystemWriter("", single_file_per_rank=True, sync_files=False)
        writer.fs = self
        writer.path = ""
        return writer

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "wb":
            raise CheckpointError(f"a sharded save only writes its files; DCP asked to open {path} with {mode!r}")
        stream = _ChunkStream(self)
        try:
            yield stream
        except BaseException:
            stream.abandon()
            raise
        self.files[str(path)] = stream.finish()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        self.files[str(new_path)] = self.files.pop(str(path))

    def mkdir(self, path: str | os.PathLike) -> None:
        pass  # names only

    def rm_file(self, path: str | os.PathLike) -> None:
        del self.files[str(path)]

    def _submit(self, buffer: mmap.mmap, size: int) -> Future:
        """Store BUFFER's first SIZE bytes as a chunk; the buffer is reused once the chunk is durable, unless the
        sink keeps it (ChunkSink.holds)."""
        piece = memoryview(buffer)[:size]
        self._slots.acquire()
        try:
            future = self._pool.submit(self.sink.put, piece)
        except BaseException:
            self._slots.release()
            raise

        def done(future: Future) -> None:
            self._slots.release()
            if not future.cancelled() and future.exception() is None and not self.sink.holds(future.result(), piece):
                piece.release()
                _BUFFERS.give_back(buffer)

        future.add_done_callback(done)
        return future


class _Buffers:
    """Anonymous mappings of CHUNK_BYTES (their pages are taken when written, not when mapped), a few kept
    between saves (KEPT_BUFFERS x 64 MiB stay with a rank that saved)."""

    def __init__(self, keep: int):
        self._keep = keep
        self._spare: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            while self._spare:
                buffer = self._spare.pop()
                if len(buffer) == CHUNK_BYTES:  # else kept under another chunk size (tests change it)
                    return buffer
        return mmap.mmap(-1, CHUNK_BYTES)

    def give_back(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(self._spare) < self._keep:
                self._spare.append(buffer)


# As many as a save on a small machine keeps in flight (WRITE_WORKERS there): more stay with every rank for good.
KEPT_BUFFERS = 4
_BUFFERS = _Buffers(keep=KEPT_BUFFERS)


class _ChunkStream(io.RawIOBase):
    """One file being written: bytes gather into a CHUNK_BYTES piece, and each full piece goes to the sink."""

    def __init__(self, files: ChunkedFiles):
        super().__init__()
        self._files = files
        self._pieces: list[Future] = []
        self._buffer: mmap.mmap | None = None
        self._filled = 0
        self._position = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        if self._failed():  # torch.save would hide an error raised here behind one of its own: `finish` raises it
            self._position += len(view)
            return len(view)
        done = 0
        while done < len(view):
            if self._buffer is None:
                self._buffer = _BUFFERS.take()
            take = min(len(view) - done, CHUNK_BYTES - self._filled)
            copy_bytes(memoryview(self._buffer)[self._filled : self._filled + take], view[done : done + take])
            self._filled += take
            done += take
            if self._filled == CHUNK_BYTES:
                self._hand_over()
        self._position += done
        return done

    def _hand_over(self) -> None:
        buffer, self._buffer = self._buffer or _BUFFERS.take(), None
        self._pieces.append(self._files._submit(buffer, self._filled))
        self._filled = 0

    def _failed(self) -> bool:
        return any(piece.done() and piece.exception() is not None for piece in self._pieces)

    def finish(self) -> FileRef:
        """The file's chunks, once every piece is durable (an empty file is one empty chunk, as write_chunks);
        raises the first piece's failure."""
        if not self._failed() and (self._filled or not self._pieces):
            self._hand_over()
        chunks: list[ChunkRef] = [piece.result() for piece in self._pieces]
        return FileRef(size=self._position, chunks=chunks)

    def abandon(self) -> None:
        for piece in self._pieces:
            piece.cancel()


class StoredFiles(_NamedFiles):
    """A checkpoint's DCP files, read from the store's chunks as DCP reads them (read-only)."""

    # Chunks fetched ahead of the one DCP reads, in parallel (reading and verifying one chunk at a time left the
    # loader waiting on it for half of a 0.5 GB restore). Kept: those, the one being read and the one before (an
    # item that straddles two chunks is read from both).
    READ_AHEAD = READ_WORKERS - 1

    def __init__(self, reader: ChunkReader, files: dict[str, FileRef]):
        self.reader = reader
        self.files = files
        self._pool = ThreadPoolExecutor(max_workers=READ_WORKERS, thread_name_prefix="tp-ckpt-read-ahead")

    def storage_reader(self, reader_class: type[FileSystemReader] = FileSystemReader) -> FileSystemReader:
        """A DCP storage reader (of READER_CLASS, such as dcp_safe.SafeFileSystemReader) whose files are these."""
        reader = reader_class("")
        reader.fs = self
        reader.path = ""
        return reader

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            raise CheckpointError(f"a checkpoint's files are read-only; DCP asked to open {path} with {mode!r}")
        ref = self.files.get(str(path))
        if ref is None:
            raise CheckpointError(f"the checkpoint has no DCP file {path} (it lists {', '.join(sorted(self.files))})")
        yield _StoredFile(self, ref)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        raise CheckpointError("a checkpoint's files are read-only")

    def mkdir(self, path: str | os.PathLike) -> None:
        raise CheckpointError("a checkpoint's files are read-only")

    def rm_file(self, path: str | os.PathLike) -> None:
        raise CheckpointError("a checkpoint's files are read-only")


class _StoredFile(io.RawIOBase):
    """A seekable view of one file's chunks; each chunk is fetched and verified once, when first read."""

    def __init__(self, files: StoredFiles, ref: FileRef):
        super().__init__()
        self._files = files
        self._chunks = ref.chunks
        self._starts = [0]
        for chunk in ref.chunks[:-1]:
            self._starts.append(self._starts[-1] + chunk.size)
        self._size = ref.size
        self._position = 0
        self._fetched: dict[int, Future] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset}, before the start of the file")
        self._position = base + offset
        return self._position

    def readinto(self, buffer) -> int:
        out = memoryview(buffer).cast("B")
        done = 0
        while done < len(out) and self._position < self._size:
            index = bisect.bisect_right(self._starts, self._position) - 1
            chunk = self._chunk(index)
            within = self._position - self._starts[index]
            take = min(len(out) - done, len(chunk) - within)
            out[done : done + take] = chunk[within : within + take]
            done += take
            self._position += take
        return done

    def _chunk(self, index: int) -> memoryview:
        data = self._fetch(index)
        for ahead in range(index + 1, min(index + 1 + StoredFiles.READ_AHEAD, len(self._chunks))):
            self._fetch(ahead)  # DCP reads a file's items in order
        # The one before and one more ahead stay too: torch.load reads an item's end before its start.
        for kept in [k for k in self._fetched if not index - 1 <= k <= index + StoredFiles.READ_AHEAD + 1]:
            del self._fetched[kept]
        return data.result()

    def _fetch(self, index: int) -> Future:
        if index not in self._fetched:
            self._fetched[index] = self._files._pool.submit(self._files.reader.read, self._chunks[index])
        return self._fetched[index]
