"""Submit and schedule the alignment pipeline on a Kubeflow Pipelines cluster (KFP v2 API, ``kfp.Client``).

Everything a user types is checked before the first request: parameter names (the valid ones are
listed) and value types against the pipeline's inputs, every value as the tasks will build it
(:func:`g2rpo.steps.check.check_arguments`: the run config, the evaluation config, the gates), the
cron expression (six fields, seconds first, evaluated in UTC by KFP), the names, and that the host answers at all — an unreachable host is reported within
:data:`CONNECT_TIMEOUT_S` seconds instead of ``kfp.Client``'s retry loop.

A scheduled run has ``max_concurrency=1`` (a retraining never overlaps the previous one) and
``no_catchup`` (a paused schedule that is re-enabled does not back-fill every missed slot). The KFP
server does not check that a recurring run's name is unused, so :func:`schedule` does: it is idempotent
by name within the experiment (a digest of the settings rides in the description), refuses other
settings under a used name unless ``replace``, and checks names against the server's column
(:data:`NAME_MAX`) first. A cron that never fires is refused (:mod:`g2rpo.steps.cron`). Every error the
server answers becomes a G2RPOError with its status, its reason and what to do (:func:`server_errors`).

``node_selector`` given as a parameter is merged over the profile's labels (:func:`merge_node_selector`):
``{pool: spot}`` keeps ``nvidia.com/gpu.product``; ``{nvidia.com/gpu.product: null}`` removes it.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from g2rpo.commands.reachability import CONNECT_TIMEOUT_S as REACHABLE_TIMEOUT_S
from g2rpo.commands.reachability import HEALTHZ, check_reachable
from g2rpo.config import safe_yaml
from g2rpo.errors import G2RPOError, problem
from g2rpo.launch.trainjob import gpus_per_node_from
from g2rpo.steps.check import check_arguments
from g2rpo.steps.cron import next_fire_times
from g2rpo.steps.placement import PlacementProfile, load_profile
from g2rpo.steps.train_pod import size_train_pod
from pipelines.alignment import PIPELINE_NAME, build_pipeline, compile_pipeline

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Submitted",
    "NAME_MAX",
    "check_cron",
    "check_host",
    "check_name",
    "check_text",
    "check_texts",
    "merge_node_selector",
    "next_fire_times",
    "parse_arguments",
    "pipeline_inputs",
    "schedule",
    "server_errors",
    "submit",
]

CONNECT_TIMEOUT_S = REACHABLE_TIMEOUT_S
_TYPES = {"String": str, "Integer": int, "Float": (int, float), "Boolean": bool, "List": list, "Dict": dict}
# KFP keeps display names (runs, recurring runs, experiments) in MySQL columns: a name longer than
# 255 characters (MySQL's VARCHAR(255)) was answered with HTTP 500 "Data too long for column
# 'DisplayName'" — after the ScheduledWorkflow had been created in Kubernetes, a schedule the API no
# longer lists. Names are checked before any request.
NAME_MAX = 255
# KFP 2.17 talks to MySQL as `utf8` (three bytes a character): a character outside the Basic Multilingual
# Plane (above U+FFFF, e.g. an emoji) in a name or a parameter was answered with HTTP 500 "Error 1366
# Incorrect string value" — after the Argo Workflow (a run, which would go on to run the whole pipeline
# unseen) or the ScheduledWorkflow (a schedule, one more per retry) had been created in Kubernetes.
# Every name and string is checked before any request.
BMP_MAX = 0xFFFF
# A recurring run made by `g2rpo pipeline schedule` says so in its description, with a digest of its
# settings: the same name with the same digest is the same schedule.
_SETTINGS_TAG = "g2rpo schedule settings sha256:"
_FIXES = {
    400: "the server refused the request's values: check the parameters and names it names",
    401: "the server wants credentials: log in (or port-forward to the API without the auth proxy)",
    403: "the server's access control refused it: check your namespace and permissions (multi-user KFP)",
    404: "check --host (the KFP API, e.g. http://localhost:8888) and that the experiment exists",
    409: "it conflicts with something already on the server: look in the KFP UI",
}
# What a failing server may have left in Kubernetes, by request: a run's Argo Workflow, a schedule's
# ScheduledWorkflow.
_LEFT_BEHIND = {
    "run": ("an Argo Workflow", "workflows"),
    "schedule": ("a ScheduledWorkflow", "scheduledworkflows"),
}


def _server_fix(kind: str | None) -> str:
    if kind not in _LEFT_BEHIND:
        return "the KFP server failed; check the KFP UI before retrying"
    thing, resource = _LEFT_BEHIND[kind]
    return (
        f"the KFP server failed; it may have created part of it ({thing}) before failing: check the "
        f"KFP UI and `kubectl get {resource}` before retrying"
    )


@dataclass(frozen=True)
class Submitted:
    """What the cluster answered."""

    kind: str  # "run", "recurring run" or "existing recurring run" (a schedule already there, kept)
    id: str
    experiment_id: str
    url: str
    replaced: tuple[str, ...] = ()  # recurring runs disabled and deleted after this one was created


def pipeline_inputs(profile: PlacementProfile | None = None) -> dict[str, str]:
    """The pipeline's parameters: name -> KFP type name (String, Integer, Float, List, Dict, Boolean)."""
    pipeline = build_pipeline(profile or load_profile())
    return {name: spec.type for name, spec in pipeline.component_spec.inputs.items()}


def parse_arguments(items: list[str] | tuple[str, ...], profile: PlacementProfile | None = None) -> dict[str, Any]:
    """``name=value`` items (values parsed as YAML: ``[1,2]`` is a list) into pipeline arguments, checked
    against the pipeline's parameters; every problem is reported at once. With ``profile``, a
    ``node_selector`` is merged over the profile's (:func:`merge_node_selector`)."""
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
            value = safe_yaml(text, f"parameter {name!r}") if text.strip() else ""
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
    if profile is not None and "node_selector" in arguments:
        arguments["node_selector"] = merge_node_selector(arguments["node_selector"], profile)
    return arguments


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def check_cron(expression: str) -> str:
    """A six-field cron expression (seconds minutes hours day-of-month month day-of-week), as KFP's
    scheduler reads it (in UTC), that fires at least once (:mod:`g2rpo.steps.cron`); returns it
    normalised to single spaces."""
    next_fire_times(expression, datetime.now(UTC), count=1)
    return " ".join(expression.split())


def check_name(field: str, name: str) -> str:
    """A display name the KFP server can store (1 to :data:`NAME_MAX` characters, one line)."""
    if not name.strip() or len(name) > NAME_MAX or "\n" in name:
        raise G2RPOError(
            problem(
                field,
                name,
                f"give 1 to {NAME_MAX} characters on one line (it has {len(name)}): the KFP server stores names "
                f"in a {NAME_MAX}-character column and fails on a longer one after it has created the schedule",
            )
        )
    return name


def check_text(field: str, value: Any) -> Any:
    """``value`` (a string, or a list or mapping holding strings, keys included) with no character the KFP
    server cannot store: none above U+FFFF (:data:`BMP_MAX`). Returns it unchanged."""
    for text in _strings(value):
        wide = [ch for ch in text if ord(ch) > BMP_MAX]
        if wide:
            shown = ", ".join(f"{ch!r} (U+{ord(ch):X})" for ch in dict.fromkeys(wide))
            raise G2RPOError(
                problem(
                    field,
                    text,
                    f"has {shown}, outside the Basic Multilingual Plane: KFP 2.17 stores names and parameters "
                    "in MySQL as utf8 (3 bytes a character) and fails on it only after creating the Kubernetes "
                    "object, which is then left behind; use characters up to U+FFFF (no emoji)",
                )
            )
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def check_texts(texts: dict[str, Any]) -> None:
    """:func:`check_text` on every ``field -> value`` (the run's names and arguments), all reported at once."""
    problems = []
    for field, value in texts.items():
        try:
            check_text(field, value)
        except G2RPOError as exc:
            problems.append(str(exc))
    if problems:
        raise G2RPOError("characters the KFP server cannot store:\n  - " + "\n  - ".join(problems))


def merge_node_selector(value: Any, profile: PlacementProfile) -> Any:
    """``node_selector``: the user's labels over the profile's, so that ``{pool: spot}`` keeps the profile's
    GPU product label; a label set to null is removed. Anything but a mapping is left for the checks."""
    if not isinstance(value, dict):
        return value
    merged = {**profile.node_selector, **value}
    return {key: label for key, label in merged.items() if label is not None}


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


@contextmanager
def server_errors(what: str, kind: str | None = None) -> Iterator[None]:
    """Turn the KFP server's errors during ``what`` into a G2RPOError: its status, its reason, what to do;
    ``kind`` ("run" or "schedule") names what a failing server may have left in Kubernetes."""
    # kfp's generated API package is slow to import: only where a request is made, as in _client.
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        fix = _FIXES.get(status, _server_fix(kind) if status >= 500 else "see the server's reason")
        raise G2RPOError(
            f"{what}: the KFP server answered {status} {exc.reason or ''}".rstrip() + f" — {_server_reason(exc)}; {fix}"
        ) from None
    except Urllib3Error as exc:
        raise G2RPOError(f"{what}: the connection to the KFP server failed ({exc}); check --host and retry") from None


def _server_reason(exc: Any) -> str:
    """The server's own message from an error reply (KFP answers ``{"error": ..., "message": ...}``)."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.body or "no message").strip()[:500]
    if not isinstance(body, dict):  # a proxy's reply, or another server's: shown as it came
        return str(exc.body).strip()[:500]
    return str(body.get("message") or body.get("error") or "no message").strip()[:500]


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
    run_name = run_name or PIPELINE_NAME
    texts = {"--run-name": run_name, "--experiment": experiment}
    _check_request_texts(arguments, texts, pipeline_root, service_account)
    check_reachable(host)  # a dead host is said at once, not after the checks below
    check_arguments(arguments, profile)  # every value, as the tasks will build it, before the first request
    arguments = size_train_pod(arguments, profile)
    check_name("--run-name", run_name)
    check_name("--experiment", experiment)
    host = check_host(host)
    client = _client(host)
    with (
        tempfile.TemporaryDirectory(prefix="g2rpo-submit-") as tmp,
        server_errors(f"submitting run {run_name!r}", "run"),
    ):
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", profile_path)
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=run_name,
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
    replace: bool = False,
) -> Submitted:
    """A recurring run of the pipeline on ``cron`` (UTC), one at a time, never back-filling;
    ``service_account`` overrides the profile's.

    Idempotent by name within the experiment (the KFP server does not check names): a recurring run of
    that name with the same settings is kept and returned (``kind`` "existing recurring run"); one with
    other settings is refused, naming it, unless ``replace``, which creates the new one and then disables
    and deletes the old one."""
    cron = check_cron(cron)
    profile = load_profile(profile_path)
    name = name or f"{PIPELINE_NAME}-schedule"
    _check_request_texts(arguments, {"--name": name, "--experiment": experiment}, pipeline_root, service_account)
    check_reachable(host)  # a dead host is said at once, not after the checks below
    check_arguments(arguments, profile)  # every value, as the tasks will build it, before the first request
    arguments = size_train_pod(arguments, profile)
    check_name("--name", name)
    check_name("--experiment", experiment)
    account = service_account or profile.service_account or None
    host = check_host(host)
    client = _client(host)
    with tempfile.TemporaryDirectory(prefix="g2rpo-schedule-") as tmp:
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", profile_path)
        digest = _settings_digest(cron, arguments, pipeline_root, account, package.read_text(encoding="utf-8"))
        with server_errors(f"finding experiment {experiment!r}"):
            experiment_id = client.create_experiment(experiment).experiment_id
        with server_errors(f"listing the recurring runs named {name!r}"):
            existing = _recurring_runs_named(client, experiment_id, name)
        same = [run for run in existing if (run.description or "").endswith(_SETTINGS_TAG + digest)]
        if same and len(existing) == 1:
            run = same[0]
            return Submitted(
                kind="existing recurring run",
                id=run.recurring_run_id,
                experiment_id=experiment_id,
                url=f"{host}/#/recurringrun/details/{run.recurring_run_id}",
            )
        if existing and not replace:
            listed = ", ".join(f"{run.recurring_run_id} ({run.status or 'unknown status'})" for run in existing)
            raise G2RPOError(
                problem(
                    "--name",
                    name,
                    f"experiment {experiment!r} already has a recurring run of this name with other settings: "
                    f"{listed}. Add --replace to create the new one and then disable and delete the old one, or "
                    "choose another --name",
                )
            )
        with server_errors(f"creating recurring run {name!r}", "schedule"):
            recurring = client.create_recurring_run(
                experiment_id,
                name,
                description=f"{_SETTINGS_TAG}{digest}",
                cron_expression=cron,
                max_concurrency=1,
                no_catchup=True,
                params=arguments,
                pipeline_package_path=str(package),
                pipeline_root=pipeline_root,
                service_account=account,
                enabled=True,
            )
    for old in existing:
        what = f"the new recurring run {recurring.recurring_run_id} exists; removing the old one {old.recurring_run_id}"
        with server_errors(what):
            client.disable_recurring_run(old.recurring_run_id)
            client.delete_recurring_run(old.recurring_run_id)
    return Submitted(
        kind="recurring run",
        id=recurring.recurring_run_id,
        experiment_id=experiment_id,
        url=f"{host}/#/recurringrun/details/{recurring.recurring_run_id}",
        replaced=tuple(run.recurring_run_id for run in existing),
    )


def _check_request_texts(
    arguments: dict[str, Any], names: dict[str, str], pipeline_root: str | None, service_account: str | None
) -> None:
    """Every name and string the request carries, before it is made (:func:`check_texts`)."""
    texts: dict[str, Any] = dict(names)
    texts.update({"--pipeline-root": pipeline_root, "--service-account": service_account})
    texts.update(arguments)
    check_texts({field: value for field, value in texts.items() if value is not None})


def _settings_digest(
    cron: str, arguments: dict[str, Any], pipeline_root: str | None, account: str | None, spec: str
) -> str:
    """sha256 of what a recurring run does: its cron, arguments, root, service account and compiled pipeline."""
    blob = json.dumps(
        {
            "cron": cron,
            "arguments": arguments,
            "pipeline_root": pipeline_root,
            "service_account": account,
            "spec": spec,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _recurring_runs_named(client: Any, experiment_id: str, name: str) -> list[Any]:
    """Every recurring run of ``experiment_id`` whose display name is exactly ``name`` (the server's filter
    ignores case; this does not), over all pages."""
    predicate = {"operation": "EQUALS", "key": "display_name", "stringValue": name}
    found, token = [], ""
    while True:
        page = client.list_recurring_runs(
            page_token=token, page_size=100, experiment_id=experiment_id, filter=json.dumps({"predicates": [predicate]})
        )
        found += [run for run in page.recurring_runs or [] if run.display_name == name]
        token = page.next_page_token or ""
        if not token:
            return found
