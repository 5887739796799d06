"""A run folder's marker and writer claim, damaged: a marker g2rpo wrote whole but finds changed is named
as the damaged marker (not mistaken for someone else's files); a claim left empty or cut short by a kill
is taken over; something that is not a file where the claim belongs is refused, never deleted."""

from __future__ import annotations

import json
import os

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.training.run_dir import MARKER, WRITER, check_run_dir, claim_run_dir


def _run_folder(tmp_path):
    out = tmp_path / "run"
    claim_run_dir(out, "hash").release()
    (out / "config.yaml").write_text("train: {}\n")
    (out / "metrics.jsonl").write_text('{"iteration": 0}\n')
    return out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda m: m.write_bytes(m.read_bytes()[:20]),
            r"run marker .*: line \d+, column \d+: not valid JSON .*ends early",
        ),
        (lambda m: m.write_bytes(b"\0" * 64), r"run marker .* holds a NUL byte"),
        (lambda m: m.write_text("[]"), r"run marker .* holds an array where an object belongs"),
        (lambda m: m.write_text('{"tool": "other"}'), r"run marker .* has tool='other', not 'g2rpo'"),
        (lambda m: (m.unlink(), m.mkdir()), r"run marker .* is a directory, not a regular file"),
    ],
)
def test_a_damaged_marker_is_named_as_such(tmp_path, damage, message):
    out = _run_folder(tmp_path)
    damage(out / MARKER)
    with pytest.raises(
        G2RPOError, match=r"output\.dir=.*" + message + r".*restore the marker from a copy or remove it"
    ):
        check_run_dir(out)
    assert (out / "metrics.jsonl").read_text() == '{"iteration": 0}\n'  # nothing touched


def test_a_claim_cut_short_is_taken_over_and_a_directory_in_its_place_is_refused(tmp_path, capsys):
    out = _run_folder(tmp_path)
    (out / WRITER).write_bytes(b'{"tool": "g2rpo", "ho')  # a holder killed while writing it
    claim = claim_run_dir(out, "hash")
    assert "the claim is empty or unreadable" in capsys.readouterr().err
    assert json.loads((out / WRITER).read_text())["pid"] == os.getpid()
    claim.release()
    (out / WRITER).mkdir()
    (out / WRITER / "keep.txt").write_text("mine")
    with pytest.raises(G2RPOError, match=r"writer claim .* is a directory, not a file g2rpo wrote: remove it"):
        claim_run_dir(out, "hash")
    assert (out / WRITER / "keep.txt").read_text() == "mine"
