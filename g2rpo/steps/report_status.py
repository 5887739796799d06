"""The pipeline's exit step: record how the run ended (whatever happened to the other tasks).

:func:`report_status` writes a :class:`RunStatus` record as JSON. ``pushgateway_url`` is where the run's
final status is to be pushed (a Prometheus Pushgateway); the push joins with the observability issue,
until then the record notes that it was not pushed.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from g2rpo.config import Section

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
) -> RunStatus:
    """Write the run's final status to ``output_path`` (JSON) and print it; see the module docstring.
    ``task`` is the task (group) the status is of: the failed one unless ``state`` is SUCCEEDED."""
    status = RunStatus(
        run=run,
        state=state,
        error=error,
        failed_task="" if state == "SUCCEEDED" else task,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        pushgateway_url=pushgateway_url,
        pushed=False,  # the Pushgateway client arrives with the observability issue
    )
    path = Path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(status.model_dump_json(indent=1) + "\n", encoding="utf-8")
    print(f"pipeline run {run}: {state}" + (f" ({status.failed_task}: {error})" if error else ""), flush=True)
    return status
