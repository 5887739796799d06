"""`pipeline run-local`'s summary reads each task's record back: one a task left cut short is named with
where the run's outputs and log are, never a JSONDecodeError at the end of the run; the champion comes
from the registry's own reader (docs/errors.md)."""

from __future__ import annotations

import pytest

from g2rpo.errors import G2RPOError
from pipelines.local import _collect


def _root(tmp_path, status: bytes):
    root = tmp_path / "pipeline-root"
    (root / "run-1" / "report-status").mkdir(parents=True)
    (root / "run-1" / "report-status" / "record").write_bytes(status)
    return root


def _arguments(tmp_path):
    return {"registry_uri": (tmp_path / "registry").as_uri(), "model_name": "flux-shapes"}


def test_a_status_record_cut_short_is_named_with_the_run_folder(tmp_path):
    root = _root(tmp_path, b'{"state": "SUCC')
    log = tmp_path / "run.log"
    with pytest.raises(
        G2RPOError, match=r"report-status record .*: line 1, column \d+: not valid JSON .*ends early.*run\.log"
    ):
        _collect(tmp_path, root, _arguments(tmp_path), log, {})


def test_an_intact_run_is_collected_and_a_missing_registry_has_no_champion(tmp_path):
    root = _root(tmp_path, b'{"state": "SUCCEEDED"}')
    (root / "run-1" / "decide" / "decision").mkdir(parents=True)
    (root / "run-1" / "decide" / "decision" / "record.json").write_text('{"promoted": false}')
    run = _collect(tmp_path, root, _arguments(tmp_path), tmp_path / "run.log", {})
    assert (run.state, run.decision, run.champion) == ("SUCCEEDED", {"promoted": False}, None)
