"""LocalStorage and key validation: atomic puts, zero-copy reads, refusal of escaping keys."""

from __future__ import annotations

import os
import time

import pytest

from training_platform.checkpoints.layout import manifest_key, pin_key, run_prefix
from training_platform.checkpoints.storage import LocalStorage, NotWanted, validate_key


@pytest.mark.parametrize(
    "key", ["../etc/passwd", "/etc/passwd", "runs/../../x", "runs//x", "runs/./x", "", "runs/a b", "runs/ü"]
)
def test_escaping_or_odd_keys_are_refused(key):
    with pytest.raises(ValueError, match="invalid storage key"):
        validate_key(key)


@pytest.mark.parametrize("run_id", ["..", "../other", "/abs", "a/../../b", ""])
def test_run_ids_that_could_escape_are_refused(run_id, tmp_path):
    with pytest.raises(ValueError, match="invalid storage key"):
        manifest_key(run_id, 1)
    with pytest.raises(ValueError, match="invalid storage key"):
        run_prefix(run_id)


def test_pin_reason_is_free_text_but_never_part_of_a_path():
    key = pin_key("run-1", 7, "../../registered model v3 /etc")
    assert key.startswith("pins/run-1/000000000007/") and ".." not in key


def test_put_get_list_delete_roundtrip(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.put("chunks/abc", memoryview(b"x" * 100))
    storage.put("runs/r/000000000001.json", b"{}")
    assert storage.get("chunks/abc") == b"x" * 100
    out = bytearray(200)
    assert storage.get_into("chunks/abc", memoryview(out)) == 100 and out[:100] == b"x" * 100
    assert storage.list("runs") == ["runs/r/000000000001.json"]
    assert [i.size for i in storage.list_info("chunks")] == [100]
    storage.delete("chunks/abc")
    assert not storage.exists("chunks/abc") and storage.list("missing") == []


def test_a_listing_names_every_file_below_its_prefix_sorted_with_its_size_and_age(tmp_path):
    storage = LocalStorage(tmp_path)
    for key, size in (("runs/b/000000000002.json", 2), ("runs/a/000000000001.json", 1), ("runs/a/x/deep", 3),
                      ("runsx/other", 4)):
        storage.put(key, b"x" * size)
    (tmp_path / "runs" / "a" / ".half.123.tmp").write_bytes(b"half")  # a write in flight
    os.utime(tmp_path / "runs" / "a" / "x" / "deep", (1000, 1000))
    infos = storage.list_info("runs/")
    assert [(i.key, i.size) for i in infos] == [
        ("runs/a/000000000001.json", 1), ("runs/a/x/deep", 3), ("runs/b/000000000002.json", 2)
    ]
    assert infos[1].modified == 1000
    assert storage.list("runs/a/000000000001.json") == [] and storage.list("nothing/here") == []


def test_get_into_refuses_an_object_larger_than_expected(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.put("chunks/abc", b"x" * 10)
    with pytest.raises(ValueError, match="larger"):
        storage.get_into("chunks/abc", memoryview(bytearray(5)))


def test_temporaries_of_killed_writers_are_invisible_and_cleaned(tmp_path):
    storage = LocalStorage(tmp_path)
    (tmp_path / "chunks").mkdir()
    stale = tmp_path / "chunks" / ".abc.123.tmp"
    stale.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert storage.list("chunks") == []
    assert storage.remove_stale_temporaries(3600) == 1 and not stale.exists()


def test_a_put_no_longer_wanted_once_durable_makes_nothing_visible(tmp_path):
    """A manifest whose trainer died during its fsync: asked after the bytes are durable, before the rename."""
    storage = LocalStorage(tmp_path)
    asked = []

    def wanted() -> bool:
        temporaries = [path.read_bytes() for path in (tmp_path / "runs" / "r").glob(".*.tmp")]
        asked.append((storage.exists("runs/r/1.json"), temporaries))
        return False

    with pytest.raises(NotWanted):
        storage.put("runs/r/1.json", b"manifest", visible_if=wanted)
    assert asked == [(False, [b"manifest"])]
    assert list((tmp_path / "runs" / "r").iterdir()) == []
    storage.put("runs/r/1.json", b"manifest", visible_if=lambda: True)
    assert storage.get("runs/r/1.json") == b"manifest"
