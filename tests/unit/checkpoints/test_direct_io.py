"""Packs are written past the page cache where the filesystem allows, byte for byte, and buffered where it does not."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
from pathlib import Path

import pytest

from training_platform.checkpoints import direct_io
from training_platform.checkpoints.storage import AppendedObject

SIZES = [1, 4095, 4097, 0, (4 << 20) + 3, 8192, 123_457]  # across the bounce buffer's end and ALIGN's


def takes_o_direct(directory: Path) -> bool:
    probe = directory / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


def resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore on a map of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        try:
            assert libc.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(byte & 1 for byte in pages.raw)


def write_pieces(path: Path, seed: int = 0) -> tuple[AppendedObject, bytes]:
    rng = random.Random(seed)
    pieces = [rng.randbytes(size) for size in SIZES]
    appended = AppendedObject(path)
    for piece in pieces:
        appended.append(piece)
    return appended, b"".join(pieces)


def test_a_pack_written_past_the_page_cache_holds_exactly_its_bytes(tmp_path):
    if not takes_o_direct(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT (the buffered test covers it)")
    appended, expected = write_pieces(tmp_path / "pack")
    assert appended.direct
    appended.commit()
    path = tmp_path / "pack"
    assert resident_pages(path) == 0  # a buffered write leaves every page cached (below)
    assert appended.size == len(expected) and path.read_bytes() == expected


def test_a_buffered_write_is_cached_which_is_what_the_direct_one_avoids(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "O_DIRECT", 0, raising=False)  # as on a system without it
    appended, expected = write_pieces(tmp_path / "pack")
    assert not appended.direct
    appended.commit()
    assert resident_pages(tmp_path / "pack") > 0 and (tmp_path / "pack").read_bytes() == expected


def test_a_write_the_kernel_refuses_as_unaligned_goes_on_buffered(tmp_path, monkeypatch):
    """EINVAL from a direct write (a block size larger than ALIGN): that file is written through the cache."""
    if not takes_o_direct(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "ALIGN", 1)  # the last block goes out unpadded: not aligned, refused
    appended, expected = write_pieces(tmp_path / "pack", seed=2)
    assert appended.direct  # the first full buffers went out directly
    appended.commit()
    assert (tmp_path / "pack").read_bytes() == expected


def test_an_aborted_pack_leaves_no_file(tmp_path):
    appended, _ = write_pieces(tmp_path / "pack")
    appended.abort()
    assert list(tmp_path.iterdir()) == []
