"""Text from the Python standard library's own source files, and the character tokenizer built from it.

Real text with no download: the ``.py`` files next to the running interpreter's ``os`` module.
The tokenizer is learned from that corpus (characters seen at least ``MIN_COUNT`` times; the
rest map to ``<unk>``) and written into the snapshot directory, named by the snapshot's source
hash, so a snapshot and the tokenizer that produced its token ids travel together.
"""

from __future__ import annotations

import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training_platform.datasets.store import SnapshotRoot, get_object, put_object
from training_platform.errors import SnapshotError

SOURCE = "python_stdlib_text"
WINDOW = 129  # tokens per row: up to 128 inputs plus the shifted target
CORPUS_BYTES = 1 << 20
MIN_COUNT = 20
UNK = "\x00"
TOKENIZER_DIR = "tokenizers"


@dataclass(frozen=True)
class CharTokenizer:
    """Id 0 is ``<unk>``; the others are the corpus's frequent characters in code point order."""

    chars: str

    @classmethod
    def learn(cls, text: str, min_count: int = MIN_COUNT) -> CharTokenizer:
        codes, counts = np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32), return_counts=True)
        frequent = "".join(chr(c) for c, n in zip(codes, counts, strict=True) if n >= min_count and chr(c) != UNK)
        return cls(UNK + frequent)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        table = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        index = np.searchsorted(table[1:], codes) + 1  # table[1:] is sorted; id 0 is <unk>
        index = np.minimum(index, len(table) - 1)
        return np.where(table[index] == codes, index, 0).astype(np.int16)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        body = json.loads(text)
        if body.get("kind") != "char":
            raise SnapshotError(f"unknown tokenizer kind {body.get('kind')!r}; rebuild the snapshot")
        return cls(body["chars"])


def stdlib_corpus(max_bytes: int = CORPUS_BYTES) -> str:
    """The first max_bytes of the standard library's top-level .py files, in name order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").is_file():
        root = Path(os.__file__).parent
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    if not parts:
        raise SnapshotError(f"no .py files under {root}; this Python installation ships no standard library source")
    return "".join(parts)[:max_bytes]


def token_windows(text: str, tokenizer: CharTokenizer, window: int = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of token ids, and each window's next token (its label; 0 after the last)."""
    ids = tokenizer.encode(text)
    rows = len(ids) // window
    windows = ids[: rows * window].reshape(rows, window)
    following = np.append(ids[window : rows * window : window], 0).astype(np.int64)
    return windows, following


def tokenizer_key(source_sha256: str) -> str:
    return f"{TOKENIZER_DIR}/{source_sha256}.json"


def write_tokenizer(snapshot_root: SnapshotRoot, source_sha256: str, tokenizer: CharTokenizer) -> None:
    put_object(snapshot_root, tokenizer_key(source_sha256), tokenizer.to_json().encode())


def load_tokenizer(snapshot_root: SnapshotRoot, manifest) -> CharTokenizer:
    """The tokenizer stored with a text snapshot, checked against the snapshot's vocabulary size."""
    key = tokenizer_key(manifest.source_sha256)
    where = f"{snapshot_root}/{key}"
    data = get_object(snapshot_root, key)
    if data is None:
        raise SnapshotError(
            f"snapshot {manifest.snapshot_id} has no tokenizer at {where}; build it again "
            f"(build_snapshot({manifest.source!r}, root), or `tp train` with the spec), which stores it"
        )
    tokenizer = CharTokenizer.from_json(data.decode())
    if tokenizer.vocab_size != manifest.num_classes:
        raise SnapshotError(f"tokenizer {where} has {tokenizer.vocab_size} tokens, snapshot {manifest.num_classes}")
    return tokenizer


def holds_tokens(manifest) -> bool:
    """Whether a snapshot's features are token ids (read as they are, never scaled)."""
    return manifest.source == SOURCE
