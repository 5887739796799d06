"""The exit task's state in every backend's vocabulary (issue 29 §2, found reading KFP 2.17's driver):
kfp.local and Vertex AI pass SUCCEEDED / FAILED / CANCELLED; the KFP backend passes the exit handler's
ML Metadata state, COMPLETE / FAILED / CANCELED / CACHED. Read as SUCCEEDED only, every successful run
on a KFP cluster was pushed as a failure (G2RPOPipelineRunFailed on every run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from g2rpo.steps.report_status import outcome_of, report_status

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "pipelines" / "compiled" / "alignment.yaml"


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("SUCCEEDED", "succeeded"),  # kfp.local, Vertex AI
        ("COMPLETE", "succeeded"),  # the KFP backend: ML Metadata's Execution.State
        ("CACHED", "succeeded"),
        ("FAILED", "failed"),
        ("CANCELLED", "cancelled"),
        ("CANCELED", "cancelled"),  # ML Metadata's spelling
        ("UNKNOWN", "failed"),  # not said to have succeeded: a failure
        ("", "failed"),
        (" complete ", "succeeded"),
    ],
)
def test_every_backends_final_state_maps_to_one_outcome(state, outcome):
    assert outcome_of(state) == outcome


def test_the_record_keeps_the_backends_state_and_says_the_outcome(tmp_path, capsys):
    ok = report_status("run-1", "COMPLETE", tmp_path / "ok.json", task="exit-handler-1")
    assert (ok.state, ok.outcome, ok.failed_task) == ("COMPLETE", "succeeded", "")
    assert "pipeline run run-1: COMPLETE (succeeded)" in capsys.readouterr().out
    failed = report_status("run-2", "FAILED", tmp_path / "failed.json", task="exit-handler-1", error="boom")
    assert (failed.outcome, failed.failed_task) == ("failed", "exit-handler-1")
    assert json.loads((tmp_path / "failed.json").read_text())["outcome"] == "failed"


def _kfp_driver_status(state: str) -> dict:
    """PipelineTaskFinalStatus as KFP 2.17's driver resolves it (backend/src/v2/driver, resolveInputParameter):
    protojson of {State: the producer's last known ML Metadata state, PipelineTaskName, PipelineJobResourceName,
    Error: an empty google.rpc.Status}."""
    return {
        "state": state,
        "pipelineJobResourceName": "alignment-abc12",
        "pipelineTaskName": "exit-handler-1",
        "error": {},
    }


@pytest.mark.parametrize(("state", "succeeded"), [("COMPLETE", True), ("FAILED", False)])
def test_the_compiled_exit_task_reads_the_kfp_drivers_status(state, succeeded, tmp_path):
    pipeline = next(yaml.safe_load_all(COMPILED.read_text(encoding="utf-8")))  # the spec; then the platform spec
    container = pipeline["deploymentSpec"]["executors"]["exec-report-status"]["container"]
    record = tmp_path / "record"
    executor_input = {
        "inputs": {"parameterValues": {"status": _kfp_driver_status(state), "pushgateway_url": ""}},
        "outputs": {
            "artifacts": {
                "record": {
                    "artifacts": [{"name": "record", "type": {"schemaTitle": "system.Artifact"}, "uri": str(record)}]
                }
            },
            "outputFile": str(tmp_path / "executor-output.json"),
        },
    }
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in container["args"]]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    done = subprocess.run([*container["command"], *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(record.read_text())
    assert written["state"] == state and (written["outcome"] == "succeeded") is succeeded, written
    assert written["failed_task"] == ("" if succeeded else "exit-handler-1")
