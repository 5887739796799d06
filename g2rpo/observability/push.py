"""Pushes of the batch steps (evaluate, decide/promote, the pipeline's exit handler) to a Pushgateway.

Each push goes under a fixed grouping key, ``job`` + ``pipeline``, and replaces that group's previous
push whole (HTTP PUT), so the gateway holds the latest summary of each step of each pipeline and
nothing older. A value that must survive a later push of the same step goes to a job of its own,
pushed only when it changes: the last promotion (``g2rpo-promotion``, pushed on a promotion only)
and the last successful run (``g2rpo-pipeline-success``, on a success only).

Jobs and their series (labels besides ``job`` and ``pipeline``):

==========================  ====================================================================
``g2rpo-evaluate``          ``g2rpo_evaluation_metric_mean``, ``..._ci_lower``, ``..._ci_upper``
                            {metric, version, steps}; ``g2rpo_evaluation_samples``
                            {metric, version, steps}; ``g2rpo_evaluation_last_run_timestamp_seconds``
``g2rpo-promote``           ``g2rpo_promotion_last_decision_timestamp_seconds`` {model, outcome, reason};
                            ``g2rpo_promotion_gate_passed``, ``g2rpo_promotion_gate_delta``
                            {model, metric, kind}; ``g2rpo_promotion_champion_info`` {model, version}
``g2rpo-promotion``         ``g2rpo_promotion_last_promotion_timestamp_seconds`` {model}
``g2rpo-pipeline``          ``g2rpo_pipeline_last_run_timestamp_seconds`` {outcome};
                            ``g2rpo_pipeline_last_run_success`` (1 or 0)
``g2rpo-pipeline-success``  ``g2rpo_pipeline_last_success_timestamp_seconds``
==========================  ====================================================================

A Pushgateway that is down, slow or answers an error makes the push return False with a
:class:`PushgatewayWarning`: observability never fails a step.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Info, push_to_gateway

from g2rpo.observability.metrics import normal_interval

__all__ = [
    "JOBS",
    "PushTarget",
    "PushgatewayWarning",
    "push_evaluation",
    "push_evaluations",
    "push_pipeline_run",
    "push_promotion",
]

JOBS = {
    "evaluate": "g2rpo-evaluate",
    "promote": "g2rpo-promote",
    "promotion": "g2rpo-promotion",
    "pipeline": "g2rpo-pipeline",
    "pipeline_success": "g2rpo-pipeline-success",
}


class PushgatewayWarning(UserWarning):
    """A push did not reach the Pushgateway; the step carries on."""


@dataclass(frozen=True)
class PushTarget:
    """Where and as what a step pushes: the gateway's URL (``http://host:9091``) and the pipeline name
    (the grouping key's ``pipeline``)."""

    url: str
    pipeline: str = "local"
    timeout: float = 5.0


def push_evaluation(
    target: PushTarget,
    by_steps: Mapping[int, Mapping[str, Mapping[str, float | int]]],
    *,
    version: str = "",
    now: float | None = None,
) -> bool:
    """Push an evaluation's per-metric summaries for each sampler step count (``{steps: {metric: {mean,
    std, n, ci_low, ci_high}}}``, metrics.json's ``by_steps``; a summary without ``ci_low``/``ci_high``
    gets the 95 % normal interval of its mean); ``version`` names what was scored (``v3``, ``base``)."""
    return push_evaluations(target, {version: by_steps}, now=now)


def push_evaluations(
    target: PushTarget,
    by_version: Mapping[str, Mapping[int, Mapping[str, Mapping[str, float | int]]]],
    *,
    now: float | None = None,
) -> bool:
    """:func:`push_evaluation` of several evaluations in one push (``{version: by_steps}``): a step that
    evaluates the challenger and the champion pushes both together, since each push replaces the last."""
    registry = CollectorRegistry()
    labels = ("metric", "version", "steps")
    mean = Gauge(
        "g2rpo_evaluation_metric_mean", "Mean score per metric over prompts × seeds", labels, registry=registry
    )
    lower = Gauge(
        "g2rpo_evaluation_metric_ci_lower", "Lower bound of the mean's 95 % interval", labels, registry=registry
    )
    upper = Gauge(
        "g2rpo_evaluation_metric_ci_upper", "Upper bound of the mean's 95 % interval", labels, registry=registry
    )
    samples = Gauge("g2rpo_evaluation_samples", "Scored (prompt, seed) pairs per metric", labels, registry=registry)
    for version, by_steps in by_version.items():
        for steps, table in by_steps.items():
            for name, summary in table.items():
                key = {"metric": name, "version": version, "steps": str(steps)}
                low, high = summary.get("ci_low"), summary.get("ci_high")
                if low is None or high is None:
                    low, high = normal_interval(float(summary["mean"]), float(summary["std"]), int(summary["n"]))
                mean.labels(**key).set(float(summary["mean"]))
                lower.labels(**key).set(float(low))
                upper.labels(**key).set(float(high))
                samples.labels(**key).set(int(summary["n"]))
    _timestamp("g2rpo_evaluation_last_run_timestamp_seconds", "Unix time of the last evaluation", registry, now)
    return _push(target, JOBS["evaluate"], registry)


def push_promotion(
    target: PushTarget,
    *,
    model: str,
    outcome: str,
    reason: str,
    champion: int | None,
    gates: Sequence[Mapping[str, Any]] = (),
    now: float | None = None,
) -> bool:
    """Push a promotion decision. ``outcome``: promoted, rejected, dry_run or error; ``reason``: a short
    fixed word (``passed``, ``gate:<metric>``, an exception's class); ``gates``: the gate results
    (``metric``, ``kind``, ``passed``, ``delta``); ``champion``: the champion version after the step.
    A promotion also pushes the time of the last promotion (job ``g2rpo-promotion``)."""
    now = time.time() if now is None else now
    registry = CollectorRegistry()
    decision = Gauge(
        "g2rpo_promotion_last_decision_timestamp_seconds",
        "Unix time of the last promotion decision, by outcome and reason",
        ("model", "outcome", "reason"),
        registry=registry,
    )
    decision.labels(model=model, outcome=outcome, reason=reason).set(now)
    passed = Gauge(
        "g2rpo_promotion_gate_passed",
        "1 if the gate passed in the last decision",
        ("model", "metric", "kind"),
        registry=registry,
    )
    delta = Gauge(
        "g2rpo_promotion_gate_delta",
        "Signed improvement of the challenger over the champion (positive = better) in the last decision",
        ("model", "metric", "kind"),
        registry=registry,
    )
    for gate in gates:
        key = {"model": model, "metric": str(gate["metric"]), "kind": str(gate["kind"])}
        passed.labels(**key).set(1 if gate["passed"] else 0)
        delta.labels(**key).set(math.nan if gate.get("delta") is None else float(gate["delta"]))
    if champion is not None:
        info = Info(
            "g2rpo_promotion_champion", "The champion version after the last decision", ("model",), registry=registry
        )
        info.labels(model=model).info({"version": str(champion)})
    ok = _push(target, JOBS["promote"], registry)
    if outcome == "promoted":
        last = CollectorRegistry()
        gauge = Gauge(
            "g2rpo_promotion_last_promotion_timestamp_seconds",
            "Unix time of the last promotion",
            ("model",),
            registry=last,
        )
        gauge.labels(model=model).set(now)
        ok = _push(target, JOBS["promotion"], last) and ok
    return ok


def push_pipeline_run(target: PushTarget, *, succeeded: bool, outcome: str = "", now: float | None = None) -> bool:
    """The pipeline's exit handler: push the run's outcome (``outcome`` defaults to succeeded/failed);
    a success also pushes the last-success time (job ``g2rpo-pipeline-success``)."""
    now = time.time() if now is None else now
    outcome = outcome or ("succeeded" if succeeded else "failed")
    registry = CollectorRegistry()
    last = Gauge(
        "g2rpo_pipeline_last_run_timestamp_seconds",
        "Unix time the last run ended, by outcome",
        ("outcome",),
        registry=registry,
    )
    last.labels(outcome=outcome).set(now)
    Gauge("g2rpo_pipeline_last_run_success", "1 if the last run succeeded", registry=registry).set(
        1 if succeeded else 0
    )
    ok = _push(target, JOBS["pipeline"], registry)
    if succeeded:
        success = CollectorRegistry()
        _timestamp(
            "g2rpo_pipeline_last_success_timestamp_seconds", "Unix time of the last successful run", success, now
        )
        ok = _push(target, JOBS["pipeline_success"], success) and ok
    return ok


def _timestamp(name: str, doc: str, registry: CollectorRegistry, now: float | None) -> None:
    Gauge(name, doc, registry=registry).set(time.time() if now is None else now)


def _push(target: PushTarget, job: str, registry: CollectorRegistry) -> bool:
    try:
        push_to_gateway(
            target.url, job=job, registry=registry, grouping_key={"pipeline": target.pipeline}, timeout=target.timeout
        )
    except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors; a malformed URL a ValueError
        warnings.warn(
            PushgatewayWarning(
                f"could not push {job} metrics to the Pushgateway {target.url} ({exc}); the step carries on without them"
            ),
            stacklevel=3,
        )
        return False
    return True
