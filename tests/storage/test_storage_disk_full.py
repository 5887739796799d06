"""A ``file://`` store on a full or read-only disk (issue 43): the write names the path, the cause
and the free space, leaves no partial temp file, and what was published before stays as it was."""

from __future__ import annotations

import pytest

from g2rpo.artifacts.storage import FileStore
from g2rpo.errors import G2RPOError


def _leftovers(root):
    return sorted(p.name for p in root.rglob("*") if p.name.startswith(".g2rpo-tmp"))


def test_put_bytes_on_a_full_disk_names_the_path_and_leaves_nothing_partial(small_disk):
    store = FileStore(small_disk / "eval")
    store.put_bytes("metrics.json", b'{"ok": 1}')  # published before the disk fills
    with pytest.raises(G2RPOError) as info:
        store.put_bytes("images/0.png", b"\0" * (3 * 2**20))  # a 3 MiB object on a 2 MiB disk
    message = str(info.value)
    assert str(small_disk / "eval" / "images" / "0.png") in message, message
    assert "no space left on the device" in message and "MiB free on" in message, message
    assert _leftovers(small_disk) == []  # the partial temp file is gone
    assert store.get_bytes("metrics.json")[0] == b'{"ok": 1}'


def test_replacing_an_object_on_a_full_disk_keeps_the_published_one(small_disk):
    store = FileStore(small_disk)
    store.put_bytes("scores.json", b"[1, 2, 3]")
    with pytest.raises(G2RPOError, match="no space left"):
        store.put_bytes("scores.json", b"\0" * (3 * 2**20))
    assert store.get_bytes("scores.json")[0] == b"[1, 2, 3]" and _leftovers(small_disk) == []


def test_put_file_and_get_file_on_a_full_disk(small_disk, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (3 * 2**20))
    store = FileStore(small_disk / "store")
    with pytest.raises(G2RPOError, match="no space left") as info:
        store.put_file("big.bin", big)
    assert str(small_disk / "store" / "big.bin") in str(info.value)
    source = FileStore(tmp_path / "src")
    source.put_file("big.bin", big)
    with pytest.raises(G2RPOError, match="no space left"):
        source.get_file("big.bin", small_disk / "down" / "big.bin")
    assert _leftovers(small_disk) == []


def test_put_bytes_in_a_read_only_folder_names_it(read_only_dir):
    with pytest.raises(G2RPOError, match="read-only") as info:
        FileStore(read_only_dir / "eval").put_bytes("metrics.json", b"{}")
    assert str(read_only_dir / "eval") in str(info.value)
