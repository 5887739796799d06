"""The compiled pipeline run by Kubeflow Pipelines itself: submitted to the KFP API server, executed by Argo and KFP's
driver and launcher with ML Metadata, artifacts in S3, the run's state reported by the persistence agent.

The backend is :mod:`tests.cluster.kfp_backend`'s (``../shared/tools/kfp`` plus MariaDB, the API server and the
persistence agent); the chart is installed in KFP's namespace by :mod:`tests.cluster.deploy` (service account,
RBAC, the ``kfp-launcher`` ConfigMap sending every artifact to ``s3://g2rpo/pipeline-root``). Nothing here plays a
part of KFP: the run is sent with ``g2rpo pipeline submit --host`` as a user sends it, and read back with
``kfp.Client().get_run()``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import UTC, datetime

import kfp
import pytest

from g2rpo.faults import fault_env
from g2rpo.steps.train_task import METRICS_FILE, checkpoint_uri_for
from tests.cluster.deploy import BUCKET, PIPELINE_ROOT
from tests.cluster.kfp_backend import NAMESPACE as KFP_NAMESPACE
from tests.cluster.kfp_runs import (
    PIPELINE,
    RUN_TIMEOUT_S,
    failed_pod_logs,
    kfp_arguments,
    mlmd_outputs,
    objects,
    output_key,
    pipeline_cli,
    read_json,
    read_text,
    run_pods,
    submit,
    tasks,
    trained_weights,
    wait_for_end,
    wait_for_run,
    wait_for_workflow,
    workflow_of,
)
from tests.cluster.trainjob_run import LogFollower, mirrored_iterations
from tests.observability.promservers import Servers
from tests.s3server import free_ports

# The retried run's train pod holds in its second iteration (the fail point counts from 0), its checkpoint 1 written.
HOLD_IN = 1
STEPS = ("prepare-data", "train", "evaluate", "decide", "promote", "report-status")


def schedule(host: str, name: str, cron: str, arguments: dict) -> str:
    """``g2rpo pipeline schedule --host --cron``; returns the recurring run id it prints."""
    done = pipeline_cli(host, "schedule", arguments, "--cron", cron, "--name", name)
    found = re.search(r"scheduled recurring run (\S+) ", done.stdout)
    assert done.returncode == 0 and found, (
        f"g2rpo pipeline schedule exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return found.group(1)


def wait_for_fired_runs(deployment, recurring_run_id: str, count: int) -> list:
    """The runs the scheduled-workflow controller started for the recurring run, once ``count`` of them have ended
    (each must be SUCCEEDED); the schedule is then disabled and deleted through the API, and a run it started
    meanwhile is waited for too."""
    client = kfp.Client(host=deployment.kfp.host)

    def fired() -> list:
        runs = client.list_runs(page_size=100, sort_by="created_at desc").runs or []
        return [r for r in runs if r.recurring_run_id == recurring_run_id]

    deadline = time.monotonic() + count * RUN_TIMEOUT_S / 2
    done: list = []
    while time.monotonic() < deadline:
        done = [r for r in fired() if r.state in ("SUCCEEDED", "FAILED", "CANCELED")]
        if len(done) >= count:
            break
        time.sleep(5)
    client.disable_recurring_run(recurring_run_id)
    for run in fired():
        if run.state not in ("SUCCEEDED", "FAILED", "CANCELED"):
            wait_for_run(deployment, run.run_id)
    client.delete_recurring_run(recurring_run_id)
    runs = fired()
    failed = [(r.run_id, r.state) for r in runs if r.state != "SUCCEEDED"]
    assert len(runs) >= count and not failed, (
        f"recurring run {recurring_run_id}: {len(runs)} runs fired, {count} wanted; not SUCCEEDED: {failed}\n"
        + (failed_pod_logs(deployment, failed[0][0]) if failed else "")
    )
    return runs


def test_the_pipeline_submitted_to_kfp_runs_to_a_promoted_champion_then_its_schedule_fires_gated_runs(
    deployment, capsys
):
    client = deployment.client()
    started = time.monotonic()
    first = submit(deployment.kfp.host, "cluster-tier-first", kfp_arguments())
    run = wait_for_run(deployment, first)
    deployment.timings["kfp run 1 (submit to SUCCEEDED)"] = time.monotonic() - started
    deployment.runs["first"] = first
    states = tasks(run)
    assert {step: states.get(step) for step in STEPS} == dict.fromkeys(STEPS, "SUCCEEDED"), states

    # Every artifact KFP's launcher wrote is under the chart's pipeline root, keyed by the run.
    prefix = f"{PIPELINE_ROOT.removeprefix(f's3://{BUCKET}/')}/{PIPELINE}/{first}/"
    keys = objects(client, prefix)
    for task, output in [
        ("prepare-data", "data"),
        ("train", "model"),
        ("evaluate", "evaluation"),
        ("decide", "report"),
    ]:
        assert any(f"/{task}/" in k and f"/{output}" in k for k in keys), (task, output, keys[:50])
    decision = read_json(client, output_key(keys, "decide", "decision", "record.json"))
    assert (decision["version"], decision["passed"], decision["champion"]) == (1, True, None), decision
    registry = read_json(client, "registry/models/g2rpo-shapes/state.json")
    assert registry["aliases"].get("champion") == 1, registry
    # The exit task was told the exit handler's state by KFP's driver and recorded a success.
    status = read_json(client, output_key(keys, "report-status", "record"))
    assert (status["outcome"], status["failed_task"]) == ("succeeded", ""), status

    # What the KFP UI shows of the run, read where it reads it: ML Metadata, as KFP's launcher recorded it (the API
    # server's task details carry no outputs). Each step's execution is COMPLETE; the metrics tab's values are the
    # ones the evaluation record in S3 holds (to ML Metadata's precision); the decision report is an HTML artifact under the pipeline root.
    held = mlmd_outputs(deployment, first)
    executed = {step: [e["state"] for e in held.get(step, {}).get("executions", [])] for step in STEPS}
    assert all(s and s[-1] == "COMPLETE" for s in executed.values()), executed
    evaluated = read_json(client, output_key(keys, "evaluate", "evaluation", "record.json"))
    logged = held["evaluate"]["outputs"]["metrics"]
    values = {k: v for k, v in logged["properties"].items() if k.startswith(("challenger.", "champion."))}
    expected = {f"challenger.{k}": v for k, v in evaluated["challenger_means"].items()}
    assert logged["type"] == "system.Metrics" and values.keys() == expected.keys(), (logged, expected)
    # ML Metadata 1.17.1's store keeps a double at 6 decimal places (measured: -2.9462890625 -> -2.946289, on the
    # C++ store over SQLite in-process too): the UI shows the metrics so rounded; the gate reads the S3 record.
    assert all(abs(values[k] - expected[k]) <= 5e-7 for k in expected), (values, expected)
    trained = held["train"]["outputs"]["metrics"]
    assert trained["type"] == "system.Metrics", trained
    assert trained["properties"].get("iterations") == kfp_arguments()["iterations"], trained
    report = held["decide"]["outputs"]["report"]
    assert report["type"] == "system.HTML" and report["uri"].startswith(f"{PIPELINE_ROOT}/{PIPELINE}/{first}/"), report

    # Scheduled retraining: the real scheduled-workflow controller fires the recurring run every minute; each fired
    # run is gated against the champion; runs never overlap (max_concurrency 1) although each outlasts the minute.
    started = time.monotonic()
    recurring = schedule(deployment.kfp.host, "cluster-tier-retraining", "0 * * * * *", kfp_arguments())
    fired = wait_for_fired_runs(deployment, recurring, count=2)
    deployment.timings["kfp schedule (2 fired runs SUCCEEDED)"] = time.monotonic() - started
    intervals = sorted((r.created_at, r.finished_at or datetime.max.replace(tzinfo=UTC)) for r in fired)
    for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
        assert start >= end, f"runs of the recurring run overlap: {intervals}"
    verdicts = []
    for fired_run in sorted(fired, key=lambda r: r.created_at)[:2]:
        keys = objects(client, prefix.replace(first, fired_run.run_id))
        decision = read_json(client, output_key(keys, "decide", "decision", "record.json"))
        assert decision["champion"] is not None and decision["version"] > 1, decision
        verdicts.append(decision)
    registry = read_json(client, "registry/models/g2rpo-shapes/state.json")
    promoted = [d["version"] for d in verdicts if d["passed"]]
    assert registry["aliases"].get("champion") == (promoted[-1] if promoted else 1), (registry, verdicts)
    with capsys.disabled():
        print(
            f"\nKFP: run {first} SUCCEEDED, champion v1; recurring run {recurring} fired "
            + "; ".join(f"v{d['version']} {'promoted' if d['passed'] else 'refused'}" for d in verdicts)
            + "; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in deployment.timings.items() if k.startswith("kfp "))
        )


def train_executor_pods(deployment, workflow: str) -> dict[str, dict]:
    """The Workflow's train executor pods (KFP's launcher as init container; Argo's node name naming the
    task): name -> pod."""
    pods = {}
    selector = f"workflows.argoproj.io/workflow={workflow}"
    listed = deployment.cluster.kubectl("-n", KFP_NAMESPACE, "get", "pods", "-l", selector, "-o", "json")
    for pod in json.loads(listed.stdout)["items"]:
        node = pod["metadata"].get("annotations", {}).get("workflows.argoproj.io/node-name", "")
        inits = [c["name"] for c in pod["spec"].get("initContainers", [])]
        if ".train." in node and "kfp-launcher" in inits:
            pods[pod["metadata"]["name"]] = pod
    return pods


def pod_spec_patch(deployment, workflow: str, patch: dict | None) -> None:
    """Set (or with None remove) the Workflow's ``spec.podSpecPatch``: Argo applies it to each pod it creates next."""
    body = {"spec": {"podSpecPatch": json.dumps(patch) if patch else None}}
    deployment.cluster.kubectl("-n", KFP_NAMESPACE, "patch", "wf", workflow, "--type=merge", "-p", json.dumps(body))


def test_a_train_pod_deleted_mid_run_is_retried_by_argo_and_resumes_from_its_s3_checkpoint(deployment, capsys):
    """The pipeline's retry policy (``set_retry``, compiled by KFP's API server into the executor template's Argo
    ``retryStrategy``) as a lost node meets it: the train task's pod is deleted (SIGTERM, its grace period) while it
    trains its second iteration, its first checkpoint mirrored to ``<store>/checkpoints/<run id>/train``. Argo starts a
    new attempt after the policy's back-off; it resumes from the newest checkpoint in S3 (the key is the run's, not
    the pod's) and the run ends SUCCEEDED with the same export weights as the first test's run of the same arguments.

    When the signal lands must not depend on the machine's speed (the run has two iterations; on CI's machine a pod
    found running after the first checkpoint had already finished): the Workflow's ``spec.podSpecPatch`` (Argo's own
    field, set on the Workflow the API server made, before the train pod exists) arms the trainer's fail point
    ``hold:1``, so the pod waits in its second iteration until it is signalled; the patch is removed before the pod is
    deleted, so the new attempt runs as submitted."""
    first = deployment.runs.get("first")
    if first is None:
        pytest.fail("the first test's run is this test's reference: run the module, not this test alone")
    _, reference, _ = trained_weights(deployment, first)
    arguments = {**kfp_arguments(), "model_name": "g2rpo-retried"}
    started = time.monotonic()
    run_id = submit(deployment.kfp.host, "cluster-tier-retried", arguments)
    checkpoints = checkpoint_uri_for(arguments["store_uri"], run_id, "train").split("/", 3)[3]
    workflow = wait_for_workflow(deployment, run_id)
    env = [{"name": k, "value": v} for k, v in fault_env(f"hold:{HOLD_IN}").items()]
    pod_spec_patch(deployment, workflow, {"containers": [{"name": "main", "env": env}]})
    assert not train_executor_pods(deployment, workflow), "the train pod was made before the fault point was armed"

    client = kfp.Client(host=deployment.kfp.host)
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    victim = None
    while victim is None and time.monotonic() < deadline:
        run = client.get_run(run_id)
        assert run.state not in ("SUCCEEDED", "FAILED", "CANCELED"), (run.state, tasks(run))
        running = [n for n, p in train_executor_pods(deployment, workflow).items() if p["status"]["phase"] == "Running"]
        victim = running[0] if running else None
        time.sleep(1)
    assert victim, f"run {run_id}: no train pod running in time; {tasks(client.get_run(run_id))}"
    follower = LogFollower(deployment.cluster, victim, namespace=KFP_NAMESPACE, container="main").start()
    while "holding in iteration" not in follower.text() and time.monotonic() < deadline:
        phase = train_executor_pods(deployment, workflow)[victim]["status"]["phase"]
        assert phase == "Running", (phase, follower.text()[-3000:])
        time.sleep(1)
    assert "holding in iteration" in follower.text(), (
        f"pod {victim} never reached the fail point hold:{HOLD_IN} (its env: "
        f"{train_executor_pods(deployment, workflow)[victim]['spec']['containers'][0].get('env')}):\n"
        + follower.text()[-3000:]
    )
    mirrored_before = mirrored_iterations(deployment, checkpoints)
    assert HOLD_IN in mirrored_before, (mirrored_before, follower.text()[-3000:])
    pod_spec_patch(deployment, workflow, None)
    deployment.cluster.kubectl("-n", KFP_NAMESPACE, "delete", "pod", victim, "--wait=false")
    deleted_log = follower.stop(timeout_s=180)
    run = wait_for_end(deployment, run_id)
    deployment.timings["kfp run with its train pod deleted (submit to SUCCEEDED)"] = time.monotonic() - started

    # Argo's record of the train executor: the deleted attempt, then a new one that succeeded.
    nodes = workflow_of(deployment, run_id)["status"]["nodes"].values()
    attempts = sorted(
        (n for n in nodes if n.get("type") == "Pod" and ".train." in n.get("name", "")
         and n.get("templateName", "").endswith("system-container-impl")),
        key=lambda n: n.get("startedAt") or "",
    )  # fmt: skip
    seen = [(n["name"], n["phase"], n.get("message")) for n in attempts]
    assert run.state == "SUCCEEDED" and tasks(run).get("train") == "SUCCEEDED", (
        f"run {run_id} is {run.state}; tasks {tasks(run)}; Argo's train attempts {seen}\n--- the deleted pod's log:\n"
        f"{deleted_log[-3000:]}\n{failed_pod_logs(deployment, run_id)}"
    )
    assert len(attempts) >= 2 and attempts[-1]["phase"] == "Succeeded", seen
    # The new attempt resumed from the checkpoint the deleted pod left, and trained to the same weights.
    record, weights, keys = trained_weights(deployment, run_id)
    events = [
        json.loads(line)
        for line in read_text(deployment.client(), output_key(keys, "train", "model", METRICS_FILE)).splitlines()
        if line.strip()
    ]
    resumed = [e["iteration"] for e in events if e.get("event") == "resumed"]
    # From the checkpoint mirrored before the pod was deleted, or from the one its trainer wrote on SIGTERM.
    assert resumed and resumed[-1] >= HOLD_IN, (resumed, deleted_log[-3000:])
    assert weights == reference, (weights, reference)
    graceful = "SIGTERM received" in deleted_log
    with capsys.disabled():
        print(
            f"\nKFP: run {run_id}: train pod {victim} deleted holding in iteration {HOLD_IN + 1}, checkpoint(s) "
            f"{mirrored_before} mirrored; Argo's attempts "
            + ", ".join(f"{n['phase']} ({n.get('message') or ''})" for n in attempts)
            + f"; the trainer {'noted' if graceful else 'did not log'} SIGTERM; resumed at iteration {resumed[-1]}; "
            f"weights equal to run {first}'s"
        )


def test_a_run_whose_decide_step_fails_reports_it_to_the_pushgateway_and_prometheus_fires_the_alert(
    deployment, tmp_path, capsys
):
    """A run whose gates file does not exist: decide fails (it has no retry policy: a missing input stays missing),
    the exit handler's report-status task is told FAILED by KFP's driver, records it and pushes it to a real
    Pushgateway on the cluster's link; a real Prometheus scraping it with the chart's rules fires
    ``G2RPOPipelineRunFailed``."""
    servers = Servers(tmp_path / "prom", *free_ports(3), gateway_host=deployment.cluster.ip()).start()
    try:
        arguments = {
            **kfp_arguments(),
            "model_name": "g2rpo-failing",
            "gates_uri": f"s3://{BUCKET}/gates/no-such-gates.yaml",
            "pushgateway_url": servers.gateway_url,
        }
        started = time.monotonic()
        run_id = submit(deployment.kfp.host, "cluster-tier-failing", arguments)
        run = wait_for_end(deployment, run_id)
        deployment.timings["kfp run with a failing step (submit to FAILED)"] = time.monotonic() - started
        states = tasks(run)
        assert run.state == "FAILED" and states.get("decide") == "FAILED", (run.state, states)
        assert states.get("report-status") == "SUCCEEDED", states
        client = deployment.client()
        keys = objects(client, f"{PIPELINE_ROOT.removeprefix(f's3://{BUCKET}/')}/{PIPELINE}/{run_id}/")
        status = read_json(client, output_key(keys, "report-status", "record"))
        assert (status["outcome"], status["pushed"]) == ("failed", True), status
        assert status["failed_task"], status
        deadline, firing = time.monotonic() + 120, []
        while not firing and time.monotonic() < deadline:
            alerts = servers.api("alerts")["alerts"]
            firing = [
                a for a in alerts if a["labels"]["alertname"] == "G2RPOPipelineRunFailed" and a["state"] == "firing"
            ]
            time.sleep(1)
        assert firing, (servers.query("g2rpo_pipeline_last_run_success"), servers.api("alerts"), servers.logs())
    finally:
        servers.stop()
    with capsys.disabled():
        print(
            f"\nKFP: run {run_id} FAILED at decide; report-status recorded {status['outcome']!r} "
            f"(task {status['failed_task']!r}) and pushed it; Prometheus fired G2RPOPipelineRunFailed "
            f"{firing[0]['labels'].get('pipeline', '')!r}"
        )


def test_a_run_cancelled_through_the_api_while_training_leaves_nothing_running(deployment, capsys):
    """``kfp.Client().terminate_run`` while train runs: Argo stops the Workflow and its pods end; the run is not
    reported SUCCEEDED. (One node: the train task trains in its own pod, so there is no TrainJob to stop.) Argo
    signals the containers through ``pods/exec``, which reaches the API server through the tier's upgrade front
    (:meth:`tests.cluster.kfp_backend.KfpBackend.front_upgrades`): the tool's proxy alone refuses it."""
    client = kfp.Client(host=deployment.kfp.host)
    arguments = {**kfp_arguments(), "iterations": 200, "model_name": "g2rpo-cancelled"}
    run_id = submit(deployment.kfp.host, "cluster-tier-cancelled", arguments)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        run = client.get_run(run_id)
        if tasks(run).get("train") == "RUNNING":
            workflow = workflow_of(deployment, run_id)["metadata"]["name"]
            if any(phase == "Running" for phase in run_pods(deployment, workflow).values()):
                break
        assert run.state not in ("SUCCEEDED", "FAILED", "CANCELED"), (run.state, tasks(run))
        time.sleep(3)
    else:
        raise AssertionError(f"run {run_id} never reached a running train step: {tasks(client.get_run(run_id))}")
    started = time.monotonic()
    client.terminate_run(run_id)
    # Done when no pod of the Workflow is left, Argo has ended the Workflow (its pods end before its phase is
    # written) and the API server no longer reports the run running.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        alive = {n: p for n, p in run_pods(deployment, workflow).items() if p in ("Pending", "Running")}
        phase = workflow_of(deployment, run_id)["status"].get("phase")
        state = client.get_run(run_id).state
        if not alive and phase not in ("Pending", "Running", None) and state not in ("RUNNING", "PENDING"):
            break
        time.sleep(3)
    else:
        raise AssertionError(
            f"run {run_id} {state}, Workflow {phase}, {time.monotonic() - started:.0f} s after terminate_run; "
            f"alive: {alive}"
        )
    assert state in ("CANCELING", "CANCELED", "FAILED"), state
    assert phase in ("Failed", "Error"), phase
    with capsys.disabled():
        print(
            f"\nKFP: run {run_id} terminated while training: {state} (Workflow {phase}), no pod left running "
            f"{time.monotonic() - started:.0f} s after terminate_run"
        )


def test_a_schedule_is_kept_refused_or_replaced_by_name_through_the_api(deployment, capsys):
    """``g2rpo pipeline schedule`` against the real API server, by the recurring run's name (a yearly cron: nothing
    fires): the same settings again keep the one there; other settings are refused, naming ``--replace``; with
    ``--replace`` the new one is created, then the old one disabled and deleted, which the API confirms."""
    name, arguments = "cluster-tier-replaced", {**kfp_arguments(), "model_name": "g2rpo-scheduled"}
    client = kfp.Client(host=deployment.kfp.host)
    first = schedule(deployment.kfp.host, name, "0 0 0 1 1 *", arguments)

    def cli(cron: str, *flags: str) -> subprocess.CompletedProcess:
        return pipeline_cli(deployment.kfp.host, "schedule", arguments, "--cron", cron, "--name", name, *flags)

    again = cli("0 0 0 1 1 *")
    assert again.returncode == 0 and f"already scheduled with these settings: recurring run {first}" in again.stdout, (
        again.stdout + again.stderr
    )
    refused = cli("0 0 0 1 7 *")
    assert refused.returncode != 0 and "--replace" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert client.get_recurring_run(first).status == "ENABLED"
    replaced = cli("0 0 0 1 7 *", "--replace")
    found = re.search(r"scheduled recurring run (\S+) ", replaced.stdout)
    assert replaced.returncode == 0 and found and f"replaced recurring run {first}" in replaced.stdout, (
        replaced.stdout + replaced.stderr
    )
    second = found.group(1)
    try:
        assert second != first
        new = client.get_recurring_run(second)
        assert (new.status, new.trigger.cron_schedule.cron) == ("ENABLED", "0 0 0 1 7 *"), new
        with pytest.raises(Exception, match="(?i)not found|404"):
            client.get_recurring_run(first)
    finally:
        client.delete_recurring_run(second)
    with capsys.disabled():
        print(f"\nKFP: schedule {name!r}: kept {first} for the same settings, refused other settings without "
              f"--replace, replaced it by {second} (the old one deleted through the API)")  # fmt: skip
