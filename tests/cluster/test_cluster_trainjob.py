"""Training through the real Kubeflow Trainer on two nodes, run by Kubeflow Pipelines: a training pod deleted
mid-run, a run cancelled while its TrainJob trains, and Prometheus on the training pods.

The pipeline is submitted with ``nodes: 2`` to the tier's KFP API server (:mod:`tests.cluster.kfp_runs`, as a user
submits it) and executed by Argo and KFP's driver and launcher in KFP's namespace: its train task's pod (KFP's
executor pod, service account ``g2rpo``) creates the TrainJob through the in-cluster API with the Kubeflow SDK,
exactly as in production (``g2rpo.launch.trainjob``). The real Trainer v2.3.0 controller and its webhooks (``cluster
trainer-up``) admit it and write the JobSet; the real JobSet v0.12.0 controller (:mod:`tests.cluster.jobset`,
started beside the cluster as the tools' README describes) turns it into an indexed Job of two pods, which
rendezvous through the headless Service's names (:mod:`tests.cluster.dns` answers them: the cluster has no CoreDNS)
and train together: torchrun, one rank per pod, DeepSpeed ZeRO-2 on gloo, CPU. The component image serves as the
trainer image here (tagged under its name in the node; the trainer image's ``nvidia/cuda`` base cannot be had).
``output.dir`` is the chart's shared volume (a ReadWriteMany claim in KFP's namespace; here a host folder, the node
being one), checkpoints are mirrored to S3, the export is published to S3; the run goes on to evaluate, decide,
promote and report-status.

Three runs of the same arguments (shapes model, T = 4, G = 4, 2 prompts per iteration, :data:`ITERATIONS`
iterations): one left alone; one whose node-0 pod is deleted (``kubectl delete pod``: SIGTERM, then the pod's grace
period) after its first checkpoint is mirrored — so that the signal lands mid-run whatever the machine's speed,
that run's training pods get the fail point ``hold:2`` (through the runtime's env): rank 0 waits in iteration 2
until it is signalled. The deleted pod must finish its iteration, write and mirror a checkpoint (iteration 3) and
say so in one line; its Job fails, the JobSet's failure policy restarts both pods, they resume from that checkpoint,
and the export's weights equal the uninterrupted run's, digest for digest. The third is terminated through the API
while its TrainJob trains: the train task's pod deletes its TrainJob on the way out, so nothing of the run is left
running.

Prometheus (Debian's, :mod:`tests.cluster.prom`) runs in the pod network and scrapes what the chart's PodMonitor
selects; the Grafana dashboard's training queries must return data for the run.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import kfp
import pytest

from g2rpo.artifacts.cache import CACHE_ENV
from g2rpo.errors import USAGE_EXIT_STATUS
from g2rpo.faults import fault_env
from g2rpo.launch.trainjob import FAIL_JOBSET_REASON, NODE_RUN_DIR, USAGE_FAILURE_RULE, job_name
from g2rpo.observability.dashboard import DEFAULT_PATH
from g2rpo.steps.train_task import checkpoint_uri_for
from tests.cluster import jobset
from tests.cluster.deploy import BUCKET, REPO, _render_chart, chart_values
from tests.cluster.dns import ClusterDNS
from tests.cluster.kfp_backend import NAMESPACE
from tests.cluster.kfp_runs import executor_pods, submit, tasks, trained_weights, wait_for_run
from tests.cluster.prom import PodPrometheus
from tests.cluster.trainjob_run import (
    ITERATIONS,
    TRAIN_TASK,
    LogFollower,
    describe,
    mirrored_iterations,
    pods_of,
    trainjob_arguments,
    trainjob_of,
    wait_for,
)
from tests.observability.promservers import CUDA_ONLY, dashboard_queries, substitute

STEPS = ("prepare-data", "train", "evaluate", "decide", "promote", "report-status")
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
KILL_IN = 2  # every attempt of the job that uses up its restarts is SIGKILLed in this iteration (iteration:N)


def _podmonitor() -> dict:
    values = chart_values("http://unused:1")
    values["monitoring"] = {"podMonitor": {"enabled": True}}
    (monitor,) = [d for d in _render_chart(values, NAMESPACE) if d["kind"] == "PodMonitor"]
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


def _checkpoint_prefix(arguments: dict, run_id: str) -> str:
    return checkpoint_uri_for(arguments["store_uri"], run_id, TRAIN_TASK).split("/", 3)[3]


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


def failed_condition(cluster, job: str) -> dict | None:
    """The TrainJob's ``Failed`` condition once it is true, else None."""
    done = cluster.kubectl("get", "trainjob", job, "-n", NAMESPACE, "-o", "json", check=False)
    if done.returncode != 0:
        return None
    conditions = json.loads(done.stdout).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Failed" and c["status"] == "True"), None)


def _explain(deployment, run_id: str) -> str:
    """What a failure message needs: the run's tasks as the API server reports them, and its TrainJob."""
    run = kfp.Client(host=deployment.kfp.host).get_run(run_id)
    return f"run {run_id} {run.state}, tasks {tasks(run)}\n{describe(deployment.cluster, trainjob_of(run_id))}"


@pytest.fixture(scope="module")
def uninterrupted(deployment, controllers):
    """The run left alone, submitted to KFP: its id, TrainJob, pods, train record and export weights."""
    arguments = {**trainjob_arguments(), "model_name": "g2rpo-two-nodes"}
    started = time.monotonic()
    run_id = submit(deployment.kfp.host, "cluster-tier-two-nodes", arguments)
    try:
        run = wait_for_run(deployment, run_id)
    except AssertionError as exc:
        raise AssertionError(f"the uninterrupted two-node run: {exc}\n{_explain(deployment, run_id)}") from None
    deployment.timings["kfp two-node run (submit to SUCCEEDED)"] = time.monotonic() - started
    job = trainjob_of(run_id)
    record, weights, _ = trained_weights(deployment, run_id)
    return {
        "run_id": run_id,
        "run": run,
        "arguments": arguments,
        "job": job,
        "record": record,
        "pods": pods_of(deployment.cluster, job),
        "weights": weights,
    }


def test_the_train_task_trains_on_two_pods_through_the_real_trainer_and_jobset(deployment, uninterrupted):
    cluster, run_id, job = deployment.cluster, uninterrupted["run_id"], uninterrupted["job"]
    states = tasks(uninterrupted["run"])
    assert {step: states.get(step) for step in STEPS} == dict.fromkeys(STEPS, "SUCCEEDED"), states
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
    identity = {"g2rpo.io/kfp-run": run_id, "app.kubernetes.io/part-of": "g2rpo"}
    jobset_labels = cluster.get("jobset", job, NAMESPACE)["metadata"]["labels"]
    for where, labels in [("trainjob", trainjob["metadata"]["labels"]), ("jobset", jobset_labels)] + [
        (p["metadata"]["name"], p["metadata"]["labels"]) for p in pods
    ]:
        assert identity.items() <= labels.items(), (where, labels)
    # No shared volume: each pod kept its part of every checkpoint in an emptyDir of its own, S3 holding the whole.
    for pod in pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        (node,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
        mounted = {m["mountPath"]: volumes[m["name"]] for m in node["volumeMounts"]}
        assert "emptyDir" in mounted.get(NODE_RUN_DIR, {}), (NODE_RUN_DIR, mounted)
        assert "output.node_local=true" in node["command"], node["command"]
    # The TrainJob was made by KFP's train executor pod (service account g2rpo, the run's small train pod).
    (task_pod,) = executor_pods(deployment, run_id, TRAIN_TASK)
    (main,) = [c for c in task_pod["spec"]["containers"] if c["name"] == "main"]
    assert task_pod["spec"]["serviceAccountName"] == "g2rpo"
    assert main["resources"]["limits"].get("cpu") in ("500m", "0.5"), main["resources"]
    assert main["resources"]["limits"].get("nvidia.com/gpu", "0") == "0", main["resources"]
    # The export, published by rank 0 under the run's store, and the task's record of it.
    export_uri = uninterrupted["record"]["export_uri"]
    assert export_uri.startswith(f"s3://{BUCKET}/store/exports/g2rpo-two-nodes/{job}/model-"), export_uri
    assert uninterrupted["weights"], export_uri
    prefix = _checkpoint_prefix(uninterrupted["arguments"], run_id)
    assert mirrored_iterations(deployment, prefix)[-1] == ITERATIONS


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
    deployment, controllers, uninterrupted, capsys
):
    cluster = deployment.cluster
    arguments = {**uninterrupted["arguments"], "model_name": "g2rpo-two-nodes-deleted"}
    started = time.monotonic()
    with runtime_env(cluster, fault_env(f"hold:{HOLD_IN}")):
        run_id = submit(deployment.kfp.host, "cluster-tier-two-nodes-deleted", arguments)
        job, prefix = trainjob_of(run_id), _checkpoint_prefix(arguments, run_id)
        wait_for(
            f"checkpoint {DELETE_AFTER} of TrainJob {job} in S3",
            lambda: DELETE_AFTER in mirrored_iterations(deployment, prefix),
            TRAINJOB_TIMEOUT_S,
            lambda: _explain(deployment, run_id),
        )
    (node0,) = [
        p for p in pods_of(cluster, job) if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    ]
    name = node0["metadata"]["name"]
    follower = LogFollower(cluster, name, namespace=NAMESPACE).start()
    wait_for(
        f"rank 0 holding in iteration {HOLD_IN}",
        lambda: "holding in iteration" in follower.text(),
        600,
        lambda: _explain(deployment, run_id),
    )
    mirrored_before = mirrored_iterations(deployment, prefix)
    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false")
    deleted_log = follower.stop(timeout_s=180)
    # Read now: the mirror keeps the last two checkpoints, so the resumed run's later ones will prune this one.
    mirrored_after = mirrored_iterations(deployment, prefix)

    try:
        wait_for_run(deployment, run_id)
    except AssertionError as exc:
        raise AssertionError(f"the two-node run with a pod deleted: {exc}\n{_explain(deployment, run_id)}") from None
    deployment.timings["kfp two-node run, a pod deleted (submit to SUCCEEDED)"] = time.monotonic() - started

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
    _, weights, _ = trained_weights(deployment, run_id)
    assert weights == uninterrupted["weights"], (weights, uninterrupted["weights"])
    with capsys.disabled():
        print(
            f"\nKFP: two-node run {run_id}: node 0's pod deleted holding in iteration {HOLD_IN + 1}; it stopped after "
            f"iteration {stopped_at} with that checkpoint mirrored; the JobSet restarted both pods, which resumed "
            f"there; weights equal to run {uninterrupted['run_id']}'s"
        )


def test_a_two_node_run_terminated_through_the_api_while_training_leaves_no_trainjob_or_pod(
    deployment, controllers, capsys
):
    """``kfp.Client().terminate_run`` while the TrainJob trains: Argo signals the train task's container, which
    deletes its TrainJob (foreground: the JobSet's pods first); nothing of the run is left running."""
    client = kfp.Client(host=deployment.kfp.host)
    arguments = {**trainjob_arguments(iterations=200), "model_name": "g2rpo-two-nodes-cancelled"}
    run_id = submit(deployment.kfp.host, "cluster-tier-two-nodes-cancelled", arguments)
    job = trainjob_of(run_id)
    wait_for(
        f"both pods of TrainJob {job} running",
        lambda: len([p for p in pods_of(deployment.cluster, job) if p["status"].get("phase") == "Running"]) == 2,
        TRAINJOB_TIMEOUT_S,
        lambda: _explain(deployment, run_id),
    )
    started = time.monotonic()
    client.terminate_run(run_id)

    def gone() -> bool:
        exists = deployment.cluster.kubectl("get", "trainjob", job, "-n", NAMESPACE, check=False).returncode == 0
        return not exists and not pods_of(deployment.cluster, job)

    wait_for(f"TrainJob {job} and its pods gone", gone, 300, lambda: _explain(deployment, run_id))
    seconds = time.monotonic() - started
    # Deleted by the train task on the SIGTERM Argo sent it: nothing else deletes a TrainJob here. Its line saying so
    # may miss the pod's log (KFP's launcher relays the task's output, and the pod ends at once): reported, not held.
    (task_pod,) = executor_pods(deployment, run_id, TRAIN_TASK)
    log = deployment.cluster.logs(task_pod["metadata"]["name"], NAMESPACE, "main")
    said = f"SIGTERM received while TrainJob {NAMESPACE}/{job} trains: deleting it" in log
    state = wait_for(
        f"run {run_id} no longer running",
        lambda: (state := client.get_run(run_id).state) not in ("RUNNING", "PENDING") and state,
        300,
        lambda: _explain(deployment, run_id),
    )
    assert state in ("CANCELING", "CANCELED", "FAILED"), state
    with capsys.disabled():
        print(
            f"\nKFP: two-node run {run_id} terminated while training: TrainJob {job} and its pods gone {seconds:.0f} s "
            f"after terminate_run; the run is {state}; the task's line saying it deleted the job "
            f"{'is' if said else 'is not'} in its pod's log"
        )


def test_a_usage_error_fails_the_trainjob_at_once_and_kfps_retry_starts_the_next_attempt(
    deployment, controllers, uninterrupted, capsys
):
    """The training pods' cache folder cannot be written (``G2RPO_CACHE_DIR`` through the runtime's env, for this
    run's first job only): ``g2rpo train`` exits 2 on every rank, the node's command keeps that status, the runtime's
    Job ``podFailurePolicy`` fails the Job and its JobSet rule ``TrainerUsageError`` fails the JobSet at once — no
    restart, as the real Job and JobSet controllers apply them. The train task fails naming why; KFP's retry of the
    task (the pipeline's ``set_retry``, through Argo) finds that job ``Failed`` and starts the next attempt's job
    (``…-a2``), which trains, with the folder fixed, to the uninterrupted run's weights."""
    cluster = deployment.cluster
    arguments = {**uninterrupted["arguments"], "model_name": "g2rpo-two-nodes-retried"}
    started = time.monotonic()
    with runtime_env(cluster, {CACHE_ENV: "/proc/g2rpo-cache"}):
        run_id = submit(deployment.kfp.host, "cluster-tier-two-nodes-usage-error", arguments)
        first = trainjob_of(run_id)
        condition = wait_for(
            f"TrainJob {first} Failed",
            lambda: failed_condition(cluster, first),
            TRAINJOB_TIMEOUT_S,
            lambda: _explain(deployment, run_id),
        )
        exits = [
            state["terminated"].get("exitCode")
            for pod in pods_of(cluster, first)
            for status in pod["status"].get("containerStatuses", [])
            if (state := status.get("state") or {}).get("terminated")
        ]
        restarts = cluster.get("jobset", first, NAMESPACE).get("status", {}).get("restarts", 0)
    assert restarts == 0, f"the JobSet restarted {restarts} time(s) on a usage error"
    assert exits and set(exits) == {USAGE_EXIT_STATUS}, exits
    assert condition.get("reason") == FAIL_JOBSET_REASON or USAGE_FAILURE_RULE in condition.get("message", ""), (
        condition
    )
    try:
        run = wait_for_run(deployment, run_id)
    except AssertionError as exc:
        raise AssertionError(f"the retried two-node run: {exc}\n{_explain(deployment, run_id)}") from None
    deployment.timings["kfp two-node run, a usage error then a retry (submit to SUCCEEDED)"] = (
        time.monotonic() - started
    )
    assert tasks(run).get("train") == "SUCCEEDED", tasks(run)
    second = job_name(run_id, TRAIN_TASK, attempt=2)
    trainjob = cluster.get("trainjob", second, NAMESPACE)
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in trainjob["status"]["conditions"]), trainjob
    assert failed_condition(cluster, first) is not None  # the failed attempt stays, for its logs
    record, weights, _ = trained_weights(deployment, run_id)
    assert f"/{second}/" in record["export_uri"] or f"/{first}/" in record["export_uri"], record["export_uri"]
    assert weights == uninterrupted["weights"], (weights, uninterrupted["weights"])
    with capsys.disabled():
        print(
            f"\nKFP: two-node run {run_id}: TrainJob {first} Failed at once on exit {USAGE_EXIT_STATUS} "
            f"({condition.get('reason')}; JobSet restarts {restarts}); KFP's retry started {second}, which completed "
            "with the uninterrupted run's weights"
        )


def test_a_trainjob_that_used_up_its_restarts_fails_and_kfps_retry_resumes_from_its_s3_checkpoint(
    deployment, controllers, uninterrupted, capsys
):
    """Every attempt of the first job is SIGKILLed in iteration :data:`KILL_IN` (fail point ``iteration:2``, through
    the runtime's env, as a node that keeps crashing would be): the first attempt mirrors checkpoints 1 and 2 and
    dies; its Job fails (not a usage error, so no rule fails the JobSet); the real JobSet controller restarts the
    group, which resumes at 2 and dies again, until the chart's restarts (``trainingRuntime.maxRestarts``, 3: a
    runtime's failure policy cannot be patched in place) are used up and the JobSet, so the TrainJob, is ``Failed``. KFP's retry of the train task finds that job failed and starts
    the next attempt's (``…-a2``, the env restored), which resumes from the same S3 checkpoint (2) — not from
    nothing — and ends with the uninterrupted run's weights."""
    cluster = deployment.cluster
    arguments = {**uninterrupted["arguments"], "model_name": "g2rpo-two-nodes-exhausted"}
    started = time.monotonic()
    max_restarts = cluster.get("clustertrainingruntime", RUNTIME)["spec"]["template"]["spec"]["failurePolicy"][
        "maxRestarts"
    ]
    assert max_restarts >= 1, max_restarts
    with runtime_env(cluster, fault_env(f"iteration:{KILL_IN}")):
        run_id = submit(deployment.kfp.host, "cluster-tier-two-nodes-restarts-used-up", arguments)
        first, prefix = trainjob_of(run_id), _checkpoint_prefix(arguments, run_id)
        condition = wait_for(
            f"TrainJob {first} Failed",
            lambda: failed_condition(cluster, first),
            TRAINJOB_TIMEOUT_S,
            lambda: _explain(deployment, run_id),
        )
        jobset_status = cluster.get("jobset", first, NAMESPACE).get("status", {})
        exits = [
            state["terminated"].get("exitCode")
            for pod in pods_of(cluster, first)
            for status in pod["status"].get("containerStatuses", [])
            if (state := status.get("state") or {}).get("terminated")
        ]
        mirrored = mirrored_iterations(deployment, prefix)
    assert jobset_status.get("restarts", 0) == max_restarts, jobset_status
    assert exits and USAGE_EXIT_STATUS not in exits and 0 not in exits, exits
    assert "restart" in f"{condition.get('reason')} {condition.get('message')}".lower(), condition
    assert max(mirrored) == KILL_IN, mirrored  # both attempts died in iteration 2, after checkpoint 2
    try:
        run = wait_for_run(deployment, run_id)
    except AssertionError as exc:
        raise AssertionError(
            f"the run whose first job used up its restarts: {exc}\n{_explain(deployment, run_id)}"
        ) from None
    deployment.timings["kfp two-node run, restarts used up then a retry (submit to SUCCEEDED)"] = (
        time.monotonic() - started
    )
    assert tasks(run).get("train") == "SUCCEEDED", tasks(run)
    second = job_name(run_id, TRAIN_TASK, attempt=2)
    trainjob = cluster.get("trainjob", second, NAMESPACE)
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in trainjob["status"]["conditions"]), trainjob
    assert failed_condition(cluster, first) is not None  # the failed attempt stays, for its logs
    (rank0,) = [
        p
        for p in pods_of(cluster, second)
        if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    ]
    resumed_log = cluster.logs(rank0["metadata"]["name"], NAMESPACE)
    assert f'"resumed_at": {KILL_IN},' in resumed_log, resumed_log[-4000:]  # from the S3 checkpoint, not from nothing
    _, weights, _ = trained_weights(deployment, run_id)
    assert weights == uninterrupted["weights"], (weights, uninterrupted["weights"])
    with capsys.disabled():
        print(
            f"\nKFP: two-node run {run_id}: TrainJob {first} killed in iteration {KILL_IN} in every attempt, Failed "
            f"after {jobset_status.get('restarts')} JobSet restart(s) (exits {sorted(set(exits))}; "
            f"{condition.get('reason')}); KFP's retry started {second}, which resumed at iteration {KILL_IN} from "
            "the S3 checkpoint and completed with the uninterrupted run's weights"
        )
