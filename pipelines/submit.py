"""Submit and schedule the alignment pipeline on a Kubeflow Pipelines cluster (KFP v2 API, ``kfp.Client``).

Everything a user types is checked before the first request: parameter names (the valid ones are
listed) and value types against the pipeline's inputs, the cron expression (six fields, seconds first,
evaluated in UTC by KFP), and that the host answers at all — an unreachable host is reported within
:data:`CONNECT_TIMEOUT_S` seconds instead of ``kfp.Client``'s retry loop.

A scheduled run has ``max_concurrency=1`` (a retraining never overlaps the previous one) and
``no_catchup`` (a paused schedule that is re-enabled does not back-fill every missed slot).
"""

from __future__ import annotations

import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from g2rpo.errors import G2RPOError, problem
from g2rpo.launch.trainjob import gpus_per_node_from
from pipelines.alignment import PIPELINE_NAME, build_pipeline, compile_pipeline
from pipelines.placement import PlacementProfile, load_profile

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Submitted",
    "check_cron",
    "check_host",
    "parse_arguments",
    "pipeline_inputs",
    "schedule",
    "submit",
]

CONNECT_TIMEOUT_S = 5.0
HEALTHZ = "/apis/v2beta1/healthz"
_TYPES = {"String": str, "Integer": int, "Float": (int, float), "Boolean": bool, "List": list, "Dict": dict}
# One cron field: *, ?, a number or name, a range a-b, a step x/n; comma-separated lists of those.
_CRON_ITEM = re.compile(r"^(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?$")
_CRON_FIELDS = (
    ("seconds", 0, 59, {}),
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}),
    ("day of week", 0, 6, {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}),
)


@dataclass(frozen=True)
class Submitted:
    """What the cluster answered."""

    kind: str  # "run" or "recurring run"
    id: str
    experiment_id: str
    url: str


def pipeline_inputs(profile: PlacementProfile | None = None) -> dict[str, str]:
    """The pipeline's parameters: name -> KFP type name (String, Integer, Float, List, Dict, Boolean)."""
    pipeline = build_pipeline(profile or load_profile())
    return {name: spec.type for name, spec in pipeline.component_spec.inputs.items()}


def parse_arguments(items: list[str] | tuple[str, ...], profile: PlacementProfile | None = None) -> dict[str, Any]:
    """``name=value`` items (values parsed as YAML: ``[1,2]`` is a list) into pipeline arguments, checked
    against the pipeline's parameters; every problem is reported at once."""
    inputs = pipeline_inputs(profile)
    arguments: dict[str, Any] = {}
    problems = []
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            problems.append(problem("parameter", item, "write name=value, e.g. iterations=100"))
            continue
        if name not in inputs:
            problems.append(problem("parameter", name, f"unknown; valid parameters: {', '.join(sorted(inputs))}"))
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        expected = _TYPES.get(inputs[name], object)
        if inputs[name] == "String" and not isinstance(value, str):
            value = text  # a string parameter takes the text as written (e.g. model_name=2024)
        elif inputs[name] == "Float" and isinstance(value, str):
            value = _number(text)  # YAML 1.1 reads 3e-6 (no dot) as a string
        if isinstance(value, bool) and inputs[name] != "Boolean" or not isinstance(value, expected):
            problems.append(problem(name, text, f"must be {inputs[name]}"))
            continue
        if name == "gpus_per_node":  # a string parameter holding a number (pipelines/alignment.py)
            try:
                value = str(gpus_per_node_from(value))
            except G2RPOError as exc:
                problems.append(str(exc))
                continue
        arguments[name] = value
    if problems:
        raise G2RPOError("bad pipeline arguments:\n  - " + "\n  - ".join(problems))
    return arguments


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def check_cron(expression: str) -> str:
    """A six-field cron expression (seconds minutes hours day-of-month month day-of-week), as KFP's
    scheduler reads it (in UTC); returns it normalised to single spaces."""
    fields = expression.split()
    fix = "six fields, seconds first, in UTC: e.g. '0 0 3 * * *' (03:00 UTC daily)"
    if len(fields) != 6:
        raise G2RPOError(problem("cron", expression, f"has {len(fields)} fields; write {fix}"))
    for text, (label, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in text.split(","):
            match = _CRON_ITEM.match(item)
            if not match or (item == "?" and label not in ("day of month", "day of week")):
                raise G2RPOError(problem("cron", expression, f"{label} field {text!r} is not valid; write {fix}"))
            if match.group(1) in ("*", "?"):
                continue
            for part in match.group(1).split("-"):
                number = names.get(part.upper()) if not part.isdigit() else int(part)
                if number is None or not low <= number <= high:
                    raise G2RPOError(
                        problem("cron", expression, f"{label} {part!r} is outside {low}-{high}; write {fix}")
                    )
    return " ".join(fields)


def check_host(host: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """``host`` without a trailing slash, once its healthz endpoint has answered within ``timeout`` seconds."""
    if not re.match(r"^https?://", host):
        raise G2RPOError(problem("--host", host, "give the KFP API URL, e.g. http://localhost:8888"))
    host = host.rstrip("/")
    try:
        with urllib.request.urlopen(host + HEALTHZ, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise G2RPOError(problem("--host", host, f"answered {exc.code} on {HEALTHZ}: is this the KFP API?")) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise G2RPOError(
            problem("--host", host, f"unreachable within {timeout:g} s ({reason}); check the URL or port-forward")
        ) from None
    return host


def _client(host: str):
    # kfp.Client pulls in the generated API package (slow): only for submit and schedule.
    import kfp

    return kfp.Client(host=host)


def submit(
    host: str,
    arguments: dict[str, Any],
    *,
    experiment: str,
    run_name: str | None = None,
    profile_path: str | Path | None = None,
    pipeline_root: str | None = None,
    service_account: str | None = None,
) -> Submitted:
    """Start one run of the pipeline (compiled for the profile) in ``experiment``; ``service_account``
    overrides the profile's (the Helm chart's CronJob passes its own)."""
    profile = load_profile(profile_path)
    host = check_host(host)
    client = _client(host)
    with tempfile.TemporaryDirectory(prefix="g2rpo-submit-") as tmp:
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", profile_path)
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=run_name or PIPELINE_NAME,
            experiment_name=experiment,
            pipeline_root=pipeline_root,
            service_account=service_account or profile.service_account or None,
        )
    return Submitted(
        kind="run",
        id=result.run_id,
        experiment_id=result.run_info.experiment_id or "",
        url=f"{host}/#/runs/details/{result.run_id}",
    )


def schedule(
    host: str,
    cron: str,
    arguments: dict[str, Any],
    *,
    experiment: str,
    name: str | None = None,
    profile_path: str | Path | None = None,
    pipeline_root: str | None = None,
    service_account: str | None = None,
) -> Submitted:
    """A recurring run of the pipeline on ``cron`` (UTC), one at a time, never back-filling;
    ``service_account`` overrides the profile's."""
    cron = check_cron(cron)
    profile = load_profile(profile_path)
    host = check_host(host)
    client = _client(host)
    experiment_id = client.create_experiment(experiment).experiment_id
    with tempfile.TemporaryDirectory(prefix="g2rpo-schedule-") as tmp:
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", profile_path)
        recurring = client.create_recurring_run(
            experiment_id,
            name or f"{PIPELINE_NAME}-schedule",
            cron_expression=cron,
            max_concurrency=1,
            no_catchup=True,
            params=arguments,
            pipeline_package_path=str(package),
            pipeline_root=pipeline_root,
            service_account=service_account or profile.service_account or None,
            enabled=True,
        )
    return Submitted(
        kind="recurring run",
        id=recurring.recurring_run_id,
        experiment_id=experiment_id,
        url=f"{host}/#/recurringrun/details/{recurring.recurring_run_id}",
    )
