"""The strict JSON reader (``g2rpo.textfile.read_json_file`` / ``decode_json``) that every record g2rpo
reads back goes through: each kind of damage is refused naming the file, what is wrong and the fix."""

from __future__ import annotations

import os

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.textfile import decode_json, read_json_file

FIX = "re-run the step that wrote it"


def _read(path, **kwargs):
    return read_json_file(path, what="test record", fix=FIX, **kwargs)


def test_a_good_object_is_read(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text('{"a": 1, "b": NaN}\n', encoding="utf-8")
    value = _read(path)
    assert value["a"] == 1 and value["b"] != value["b"]  # NaN, as json.dumps writes it


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"iteration": 3, "lo', r"line 1, column 18: not valid JSON .* it ends early, like a write cut short"),
        (b"", r"is empty \(a write cut short"),
        (b"  \n", r"is empty"),
        (b'{"a": 1}\0\0\0', r"line 1, column 9 holds a NUL byte"),
        ('{"a": 1}'.encode("utf-16"), r"is UTF-16"),
        (b'{"a": "\xe9"}', r"byte 0xe9 is not UTF-8"),
        (b"[1, 2]", r"holds an array where an object belongs"),
        (b"null", r"holds null where an object belongs"),
        (b'{"a": 1} {"b": 2}', r"line 1, column 10: not valid JSON \(Extra data\)"),
    ],
)
def test_each_kind_of_damage_is_named_with_the_fix(tmp_path, content, message):
    path = tmp_path / "record.json"
    path.write_bytes(content)
    with pytest.raises(G2RPOError, match=message) as caught:
        _read(path)
    assert str(path) in str(caught.value) and str(caught.value).endswith(FIX)


def test_a_directory_fifo_or_oversized_file_is_refused_before_reading(tmp_path):
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(G2RPOError, match=r"is a directory, not a regular file: " + FIX):
        _read(tmp_path / "dir.json")
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(G2RPOError, match=r"is a FIFO \(named pipe\), not a regular file"):
        _read(tmp_path / "pipe.json")  # never opened: this would block otherwise
    big = tmp_path / "big.json"
    big.write_text('{"a": "' + "x" * 2000 + '"}', encoding="utf-8")
    with pytest.raises(G2RPOError, match=r"is 2,009 bytes, over the 1,024-byte limit for a test record: " + FIX):
        _read(big, max_bytes=1024)
    with pytest.raises(G2RPOError, match=r"does not exist: " + FIX):
        _read(tmp_path / "missing.json")


def test_bytes_from_a_store_get_the_same_checks():
    assert decode_json(b'[{"a": 1}]', "s3://b/x.json", fix=FIX, expect=list) == [{"a": 1}]
    with pytest.raises(G2RPOError, match=r"s3://b/x.json holds an object where an array belongs"):
        decode_json(b'{"a": 1}', "s3://b/x.json", fix=FIX, expect=list)
