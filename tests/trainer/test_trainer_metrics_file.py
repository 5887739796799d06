"""``metrics.jsonl`` after a kill: the line a killed writer cut is read around (the last line still being
written is skipped; a cut line the next run ended is skipped because its ``torn_line`` event names it),
and any other damage is refused naming the line (docs/errors.md)."""

from __future__ import annotations

import json

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.training.metrics import append_record, read_iteration_records, read_metrics_records


def _write(path, records, tail=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)


def test_a_cut_last_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [{"iteration": 0, "loss": 1.0}, {"iteration": 1, "loss": 0.5}], tail=b'{"iteration": 2, "lo')
    assert [r["iteration"] for r in read_iteration_records(path)] == [0, 1]
    path.write_bytes(path.read_bytes() + b"\0" * 7)  # a crash can leave zeros where the tail was
    assert [r["iteration"] for r in read_iteration_records(path)] == [0, 1]


def test_the_resumed_run_ends_the_cut_line_and_every_record_stays_readable(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [{"iteration": 0}, {"iteration": 1}, {"iteration": 2}], tail=b'{"iteration": 3, "lo')
    before = path.read_bytes()
    append_record(path, {"event": "resumed", "iteration": 2})
    append_record(path, {"iteration": 3, "loss": 0.25})
    after = path.read_bytes()
    assert after.startswith(before + b"\n")  # nothing already written is changed
    records = read_metrics_records(path)
    assert records[3]["event"] == "torn_line" and records[3]["line"] == 4
    assert [r.get("event") for r in records[4:]] == ["resumed", None]
    assert [(r["iteration"], r.get("loss")) for r in read_iteration_records(path)] == [
        (0, None),
        (1, None),
        (2, None),
        (3, 0.25),
    ]
    append_record(path, {"iteration": 4})  # an intact file gets no marker
    assert read_metrics_records(path)[-1] == {"iteration": 4}


def test_other_damage_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [{"iteration": 0}])
    path.write_bytes(path.read_bytes() + b'{"iteration": 1, "lo\n' + b"[1, 2]\n" + b'{"iteration": 2}\n')
    with pytest.raises(
        G2RPOError, match=r"metrics.jsonl': line 2 not valid JSON .*\(and 1 more line\(s\)\): .*restore it"
    ):
        read_iteration_records(path)
    path.write_bytes(b'{"iteration": 0}\n\xff\xfe\n{"iteration": 1}\n')
    with pytest.raises(G2RPOError, match=r"line 2 byte 0xff at column 1 is not UTF-8"):
        read_metrics_records(path)
    (tmp_path / "dir").mkdir()
    with pytest.raises(G2RPOError, match=r"is a directory, not a regular file"):
        read_metrics_records(tmp_path / "dir")
