"""The pipeline's exit step: record how the run ended (whatever happened to the other tasks).

:func:`report_status` writes a :class:`RunStatus` record as JSON and, with ``pushgateway_url``, pushes
the outcome to that Prometheus Pushgateway (:func:`g2rpo.observability.push_pipeline_run`: the last
run's outcome and, on success, the last-success time, under ``pipeline``). A gateway that is down is
a warning and ``pushed`` false: the exit task never fails for it.

The state's vocabulary depends on who runs the pipeline. ``kfp.local`` and Vertex AI pass
``SUCCEEDED`` / ``FAILED`` / ``CANCELLED``; the KFP 2.x backend (its driver, up to 2.17 at least)
passes the ML Metadata state of the exit handler's DAG execution: ``COMPLETE`` / ``FAILED`` /
``CANCELED`` (``CACHED`` for one taken from the cache). :func:`outcome_of` maps every one of them to
``succeeded`` / ``failed`` / ``cancelled``; what is pushed and alerted on is that outcome. Read as
``SUCCEEDED`` only, every successful run on a KFP cluster was reported as not succeeded, firing
``G2RPOPipelineRunFailed`` and, a day later, ``G2RPONoSuccessfulRetraining``.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from g2rpo.config import Section
from g2rpo.observability.push import PushTarget, push_pipeline_run

__all__ = ["RunStatus", "outcome_of", "report_status"]

SUCCEEDED_STATES = frozenset({"SUCCEEDED", "COMPLETE", "CACHED"})  # Vertex/kfp.local; KFP's ML Metadata states
CANCELLED_STATES = frozenset({"CANCELLED", "CANCELED", "CANCELLING"})


def outcome_of(state: str) -> str:
    """``succeeded``, ``failed`` or ``cancelled`` for any backend's final state (module docstring); an
    unknown state is a failure: the run did not say it succeeded."""
    normal = state.strip().upper()
    if normal in SUCCEEDED_STATES:
        return "succeeded"
    if normal in CANCELLED_STATES:
        return "cancelled"
    return "failed"


class RunStatus(Section):
    """How a pipeline run ended."""

    run: str = Field(description="the pipeline run's name or id")
    state: str = Field(description="the final state as the backend passed it: SUCCEEDED or COMPLETE, FAILED, ...")
    outcome: str = Field(description="succeeded, failed or cancelled: the state in one vocabulary (outcome_of)")
    error: str = Field("", description="the failure's message, when there is one")
    failed_task: str = Field("", description="the task whose failure ended the run")
    finished_at: str = Field(description="UTC, ISO 8601")
    pushgateway_url: str = Field("", description="where the status was to be pushed ('' for nowhere)")
    pushed: bool = Field(description="whether it reached the Pushgateway")


def report_status(
    run: str,
    state: str,
    output_path: str | Path,
    *,
    error: str = "",
    task: str = "",
    pushgateway_url: str = "",
    pipeline: str = "g2rpo-alignment",
) -> RunStatus:
    """Write the run's final status to ``output_path`` (JSON) and print it; see the module docstring.
    ``task`` is the task (group) the status is of: the failed one unless the run succeeded.
    ``pipeline`` is the pushed series' ``pipeline`` label (the pipeline's name, not the run's)."""
    pushed, outcome = False, outcome_of(state)
    if pushgateway_url:
        target = PushTarget(pushgateway_url, pipeline=pipeline)
        pushed = push_pipeline_run(target, succeeded=outcome == "succeeded", outcome=outcome)
    status = RunStatus(
        run=run,
        state=state,
        outcome=outcome,
        error=error,
        failed_task="" if outcome == "succeeded" else task,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        pushgateway_url=pushgateway_url,
        pushed=pushed,
    )
    path = Path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(status.model_dump_json(indent=1) + "\n", encoding="utf-8")
    said = state if state.lower() == outcome else f"{state} ({outcome})"
    print(f"pipeline run {run}: {said}" + (f" ({status.failed_task}: {error})" if error else ""), flush=True)
    return status
