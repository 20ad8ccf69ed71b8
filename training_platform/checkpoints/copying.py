"""Copying bytes between buffers without holding the GIL.

A memoryview's slice assignment is one memcpy, but made holding the GIL: 64 MiB take ~10 ms, during which no other
thread of the process runs Python. A save in a training process's thread then stalls the loop's Python (FSDP's
hooks, say) for each copy. numpy's copy of plain bytes releases the GIL for the memcpy.
"""

from __future__ import annotations


def copy_bytes(destination: memoryview, source: bytes | bytearray | memoryview) -> None:
    """destination[:] = source, the GIL released (same length; destination writable)."""
    import numpy as np  # here: the checkpoint store is imported by every `tp` command, which copies nothing

    np.frombuffer(destination, dtype=np.uint8)[:] = np.frombuffer(source, dtype=np.uint8)
