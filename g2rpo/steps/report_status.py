"""The pipeline's exit step: record how the run ended (whatever happened to the other tasks).

:func:`report_status` writes a :class:`RunStatus` record as JSON and, with ``pushgateway_url``, pushes
the outcome to that Prometheus Pushgateway (:func:`g2rpo.observability.push_pipeline_run`: the last
run's outcome and, on success, the last-success time, under ``pipeline``). A gateway that is down is
a warning and ``pushed`` false: the exit task never fails for it.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from g2rpo.config import Section
from g2rpo.observability.push import PushTarget, push_pipeline_run

__all__ = ["RunStatus", "report_status"]


class RunStatus(Section):
    """How a pipeline run ended."""

    run: str = Field(description="the pipeline run's name or id")
    state: str = Field(description="the final state KFP reports: SUCCEEDED, FAILED, CANCELLED, ...")
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
    ``task`` is the task (group) the status is of: the failed one unless ``state`` is SUCCEEDED.
    ``pipeline`` is the pushed series' ``pipeline`` label (the pipeline's name, not the run's)."""
    pushed = False
    if pushgateway_url:
        target = PushTarget(pushgateway_url, pipeline=pipeline)
        pushed = push_pipeline_run(target, succeeded=state == "SUCCEEDED", outcome=state.lower())
    status = RunStatus(
        run=run,
        state=state,
        error=error,
        failed_task="" if state == "SUCCEEDED" else task,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        pushgateway_url=pushgateway_url,
        pushed=pushed,
    )
    path = Path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(status.model_dump_json(indent=1) + "\n", encoding="utf-8")
    print(f"pipeline run {run}: {state}" + (f" ({status.failed_task}: {error})" if error else ""), flush=True)
    return status
