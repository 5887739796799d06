"""Training through the real Kubeflow Trainer on two nodes, a training pod deleted mid-run, and Prometheus on the pods.

On the tier's deployment (:mod:`tests.cluster.deploy`), the pipeline's own train task runs with ``nodes: 2``: its pod
(KFP's executor pod, service account ``g2rpo``) creates the TrainJob through the in-cluster API with the Kubeflow
SDK, exactly as in production (``g2rpo.launch.trainjob``). The real Trainer v2.3.0 controller and its webhooks
(``cluster trainer-up``) admit it and write the JobSet; the real JobSet v0.12.0 controller
(:mod:`tests.cluster.jobset`, started beside the cluster as the tools' README describes) turns it into an indexed
Job of two pods, which rendezvous through the headless Service's names (:mod:`tests.cluster.dns` answers them:
the cluster has no CoreDNS) and train together: torchrun, one rank per pod, DeepSpeed ZeRO-2 on gloo, CPU. The
component image serves as the trainer image here (tagged under its name in the node; the trainer image's
``nvidia/cuda`` base cannot be had). ``output.dir`` is the chart's shared volume (a ReadWriteMany claim; here a
host folder, the node being one), checkpoints are mirrored to S3, the export is published to S3.

Two runs of the same config (shapes model, T = 4, G = 4, 2 prompts per iteration, :data:`ITERATIONS` iterations):
one left alone, one whose node-0 pod is deleted (``kubectl delete pod``: SIGTERM, then the pod's grace period)
after its first checkpoint is mirrored. So that the signal lands mid-run whatever the machine's speed, that run's
pods get the fail point ``hold:2`` (through the runtime's env): rank 0 waits in iteration 2 until it is signalled
(without it, a fast run was sometimes past its last iteration when the pod went). The deleted pod must finish its
iteration, write and mirror a checkpoint (iteration 3) and say so in one line; its Job fails, the JobSet's failure policy restarts both pods, they resume from that
checkpoint, and the export's weights equal the uninterrupted run's, digest for digest.

Prometheus (Debian's, :mod:`tests.cluster.prom`) runs in the pod network and scrapes what the chart's PodMonitor
selects; the Grafana dashboard's training queries must return data for the run.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager

import pytest

from g2rpo.faults import fault_env
from g2rpo.observability.dashboard import DEFAULT_PATH
from g2rpo.steps.train_task import checkpoint_uri_for
from tests.cluster import jobset
from tests.cluster.deploy import (
    BUCKET,
    NAMESPACE,
    REPO,
    _render_chart,
    chart_values,
    finish_step,
    run_step,
    start_step,
)
from tests.cluster.dns import ClusterDNS
from tests.cluster.kfp_tasks import CompiledPipeline, Run
from tests.cluster.prom import PodPrometheus
from tests.cluster.trainjob_run import (
    ITERATIONS,
    TRAIN_TASK,
    LogFollower,
    describe,
    export_weights,
    mirrored_iterations,
    pods_of,
    trainjob_arguments,
    trainjob_of,
    wait_for,
)
from tests.observability.promservers import CUDA_ONLY, dashboard_queries, substitute

DASHBOARD = json.loads((REPO / DEFAULT_PATH).read_text())
# Series the run cannot produce: validation is off in this run (the observability tier checks those panels).
NOT_PRODUCED = CUDA_ONLY | {
    "g2rpo_training_validation_mean",
    "g2rpo_training_validation_ci",
    "g2rpo_training_validation_objective",
    "g2rpo_training_validation_selected_iteration",
    "g2rpo_training_validation_breached_metrics",
    "g2rpo_training_early_stopped",
    "g2rpo_training_validation_seconds_total",
}
TRAINJOB_TIMEOUT_S = 1500
DELETE_AFTER = 1  # node-0's pod is deleted once this iteration's checkpoint is mirrored ...
HOLD_IN = DELETE_AFTER + 1  # ... and its rank 0 holds in this iteration (the fail point hold:N)
RUNTIME = "g2rpo-torch-distributed"  # the chart's ClusterTrainingRuntime (trainingRuntime.name)
RUNTIME_ENV = "/spec/template/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env"


def _podmonitor() -> dict:
    values = chart_values("http://unused:1")
    values["monitoring"] = {"podMonitor": {"enabled": True}}
    (monitor,) = [d for d in _render_chart(values) if d["kind"] == "PodMonitor"]
    return monitor


@pytest.fixture(scope="module")
def controllers(deployment):
    """The JobSet controller, the names the pods look each other up by, and Prometheus on the pod network."""
    if not jobset.available():
        pytest.skip(f"no {jobset.BINARY.name} in ../shared/tools/cluster: the TrainJob's JobSet would never run")
    cluster = deployment.cluster
    started = time.monotonic()
    controller = jobset.JobSetController(cluster)
    dns = ClusterDNS(cluster, cluster.ip(), NAMESPACE)
    prometheus = PodPrometheus(cluster, _podmonitor())
    try:
        controller.start()
        dns.start()
        prometheus.start()
        deployment.timings["jobset + dns + prometheus up"] = time.monotonic() - started
        yield {"jobset": controller, "dns": dns, "prometheus": prometheus}
    finally:
        prometheus.stop()
        dns.stop()
        controller.stop()


def _new_run(prepared: dict | None = None) -> Run:
    pipeline = CompiledPipeline.load()
    run_id = str(uuid.uuid4())
    run = Run(pipeline, trainjob_arguments(), run_id, f"{pipeline.name}-{run_id[:5]}", f"s3://{BUCKET}/pipeline-root")
    if prepared is not None:  # the same prepared data (as KFP's cache would give a second run)
        run.outputs["prepare-data"] = prepared
    return run


def _checkpoint_prefix(run: Run) -> str:
    uri = checkpoint_uri_for(f"s3://{BUCKET}/store", run.run_id, TRAIN_TASK)
    return uri.split("/", 3)[3]


@contextmanager
def runtime_env(cluster, variables: dict[str, str]):
    """``variables`` on the training pods of TrainJobs created meanwhile (a JSON patch of the runtime)."""
    env = cluster.get("clustertrainingruntime", RUNTIME)
    for part in RUNTIME_ENV.strip("/").split("/"):
        env = env[int(part)] if part.isdigit() else env[part]
    patch = [{"op": "add", "path": f"{RUNTIME_ENV}/-", "value": {"name": k, "value": v}} for k, v in variables.items()]
    cluster.kubectl("patch", "clustertrainingruntime", RUNTIME, "--type=json", "-p", json.dumps(patch))
    try:
        yield
    finally:
        # The added entries follow the runtime's own: removing at its length len(variables) times takes them all.
        restore = [{"op": "remove", "path": f"{RUNTIME_ENV}/{len(env)}"} for _ in variables]
        cluster.kubectl("patch", "clustertrainingruntime", RUNTIME, "--type=json", "-p", json.dumps(restore))


def _train(deployment, run: Run, what: str) -> dict:
    job = trainjob_of(run.run_id)
    try:
        record = run_step(deployment, run, TRAIN_TASK)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}\n--- TrainJob {job}:\n{describe(deployment.cluster, job)}") from None
    return record


@pytest.fixture(scope="module")
def uninterrupted(deployment, controllers):
    """The run left alone: prepare, then train on two nodes; its record, pods and export weights."""
    run = _new_run()
    run_step(deployment, run, "prepare-data")
    started = time.monotonic()
    record = _train(deployment, run, "the uninterrupted two-node run")
    deployment.timings["two-node train task (uninterrupted)"] = time.monotonic() - started
    job = trainjob_of(run.run_id)
    export_uri = record["artifacts"]["model"]["metadata"]["export_uri"]
    return {
        "run": run,
        "job": job,
        "record": record,
        "pods": pods_of(deployment.cluster, job),
        "weights": export_weights(deployment, export_uri),
        "export_uri": export_uri,
    }


def test_the_train_task_trains_on_two_pods_through_the_real_trainer_and_jobset(deployment, uninterrupted):
    cluster, run, job = deployment.cluster, uninterrupted["run"], uninterrupted["job"]
    trainjob = cluster.get("trainjob", job, NAMESPACE)
    complete = [c for c in trainjob["status"]["conditions"] if c["type"] == "Complete" and c["status"] == "True"]
    assert complete, trainjob["status"]
    pods = uninterrupted["pods"]
    assert sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert all(p["status"]["phase"] == "Succeeded" for p in pods), [p["status"] for p in pods]
    # One rank per pod, two nodes: torchrun's rendezvous through the JobSet's names.
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["PET_NNODES"] == "2" and env["PET_MASTER_ADDR"] == f"{job}-node-0-0.{job}", env
        assert "--nproc-per-node=1" in pod["spec"]["containers"][0]["command"][2]
    # The run's identity (issue 29 §2): on the TrainJob, and through the runtime patch on the JobSet and the pods.
    identity = {"g2rpo.io/kfp-run": run.run_id, "app.kubernetes.io/part-of": "g2rpo"}
    jobset_labels = cluster.get("jobset", job, NAMESPACE)["metadata"]["labels"]
    for where, labels in [("trainjob", trainjob["metadata"]["labels"]), ("jobset", jobset_labels)] + [
        (p["metadata"]["name"], p["metadata"]["labels"]) for p in pods
    ]:
        assert identity.items() <= labels.items(), (where, labels)
    # The export, published by rank 0 under the run's store, and the task's record of it.
    assert uninterrupted["export_uri"].startswith(f"s3://{BUCKET}/store/exports/g2rpo-shapes/{job}/model-")
    assert uninterrupted["weights"], uninterrupted["export_uri"]
    assert mirrored_iterations(deployment, _checkpoint_prefix(run))[-1] == ITERATIONS


def test_prometheus_scrapes_the_training_pods_and_the_dashboards_training_queries_return_data(
    deployment, controllers, uninterrupted
):
    prometheus = controllers["prometheus"]
    job = uninterrupted["job"]
    scraped = prometheus.query_range(f'g2rpo_training_iteration{{trainjob="{job}"}}')
    assert scraped, f"no g2rpo_training_iteration of {job}; targets: {json.dumps(prometheus.targets())[:3000]}"
    assert {s["metric"]["node_rank"] for s in scraped} == {"0"}, scraped  # rank 0 serves the run's metrics
    # ... and only node 0's pod is a target (node 1's, listening on nothing, would be a target down)
    up = prometheus.query_range(f'up{{trainjob="{job}"}}')
    assert {s["metric"]["node_rank"] for s in up} == {"0"}, up
    assert max(float(v) for s in scraped for _, v in s["values"]) == ITERATIONS
    run_id = scraped[0]["metric"]["run_id"]
    queries = [
        (title, substitute(expr, {"pipeline": ".*", "run": run_id}))
        for title, expr in dashboard_queries(DASHBOARD)
        if "g2rpo_training_" in expr
    ]
    assert len(queries) >= 20, queries
    empty = []
    for title, expr in queries:
        names = {n for n in NOT_PRODUCED if n in expr}
        if not prometheus.query_range(expr) and not names:
            empty.append(f"{title}: {expr}")
    assert not empty, "dashboard training queries without data:\n" + "\n".join(empty)


def test_a_training_pod_deleted_mid_run_checkpoints_and_the_run_resumes_to_the_same_weights(
    deployment, controllers, uninterrupted
):
    cluster = deployment.cluster
    run = _new_run(uninterrupted["run"].outputs["prepare-data"])
    job, prefix = trainjob_of(run.run_id), _checkpoint_prefix(run)
    started = time.monotonic()
    with runtime_env(cluster, fault_env(f"hold:{HOLD_IN}")):
        task_pod = start_step(deployment, run, TRAIN_TASK)

        def explain() -> str:
            return f"train task pod {task_pod}:\n{cluster.logs(task_pod, NAMESPACE)[-3000:]}\n{describe(cluster, job)}"

        wait_for(
            f"checkpoint {DELETE_AFTER} of TrainJob {job} in S3",
            lambda: DELETE_AFTER in mirrored_iterations(deployment, prefix),
            TRAINJOB_TIMEOUT_S,
            explain,
        )
    (node0,) = [
        p for p in pods_of(cluster, job) if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    ]
    name = node0["metadata"]["name"]
    follower = LogFollower(cluster, name).start()
    wait_for(f"rank 0 holding in iteration {HOLD_IN}", lambda: "holding in iteration" in follower.text(), 600, explain)
    mirrored_before = mirrored_iterations(deployment, prefix)
    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false")
    deleted_log = follower.stop(timeout_s=180)
    # Read now: the mirror keeps the last two checkpoints, so the resumed run's later ones will prune this one.
    mirrored_after = mirrored_iterations(deployment, prefix)

    record = finish_step(deployment, run, TRAIN_TASK, task_pod, started)
    deployment.timings["two-node train task (a pod deleted)"] = time.monotonic() - started

    # The deleted pod: SIGTERM noted, its iteration finished, a checkpoint written and mirrored, one line saying so.
    assert "SIGTERM received: finishing this iteration" in deleted_log, deleted_log[-4000:]
    stops = [line for line in deleted_log.splitlines() if "stopped by SIGTERM after iteration" in line]
    assert stops, deleted_log[-4000:]
    stopped_at = int(stops[0].split("after iteration ")[1].split(";")[0])
    assert stopped_at == HOLD_IN + 1 and max(mirrored_before) < stopped_at, (stopped_at, mirrored_before)
    assert stopped_at in mirrored_after, mirrored_after
    # The JobSet restarted the group; the new pods resumed from that checkpoint and finished the run.
    restarted = cluster.get("jobset", job, NAMESPACE)
    assert restarted["status"].get("restarts", 0) >= 1, restarted["status"]
    (new0,) = [
        p for p in pods_of(cluster, job) if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    ]
    assert new0["metadata"]["name"] != name
    resumed_log = cluster.logs(new0["metadata"]["name"], NAMESPACE)
    assert f'"resumed_at": {stopped_at},' in resumed_log, resumed_log[-4000:]  # the run's summary (rank 0)
    # Same final weights as the run left alone.
    weights = export_weights(deployment, record["artifacts"]["model"]["metadata"]["export_uri"])
    assert weights == uninterrupted["weights"], (weights, uninterrupted["weights"])
