"""The TrainJob launcher against a loopback Kubernetes API: the real Kubeflow SDK (``TrainerClient``)
makes every request; the generated TrainJob is checked against the Trainer's API models and CRD."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubeapi import KubeAPI, condition, rbac_calls
from kubeflow_trainer_api import models

from g2rpo.errors import ConfigError, G2RPOError
from g2rpo.launch.trainjob import (
    CONFIG_ENV,
    MAX_ATTEMPTS,
    TRAINING_RUNTIME,
    Placement,
    TrainJobLaunch,
    job_name,
    launch_trainjob,
)
from tests.chart.chart_render import CRD_DIR
from tests.shared_checkout import require_shared

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The CRD schemas of ../shared/crds (beside the checkout, here and in CI; not vendored).
CRD = CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"
API_CALLS = FIXTURES / "trainjob_api_calls.json"
# The calls of a task stopped by SIGTERM while it waits (the delete of its job); the chart's Role grants these too.
API_CALLS_TERMINATED = FIXTURES / "trainjob_api_calls_terminated.json"
NAMESPACE = "team-a"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"

PLACEMENT = Placement(
    gpus_per_node=8,
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    shm_size="128Gi",
    service_account="g2rpo-trainer",
)


def _complete_after(polls: int):
    return lambda job, n: {"conditions": [condition("Complete", "all nodes succeeded")]} if n >= polls else None


def _launch(api: KubeAPI, **overrides) -> TrainJobLaunch:
    fields = dict(
        image="ghcr.io/g2rpo/g2rpo:0.1.0",
        run_id="3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a",
        task="train",
        namespace=NAMESPACE,
        placement=PLACEMENT,
        env={"AWS_ENDPOINT_URL": "http://seaweedfs.storage:8333"},
        s3_secret="g2rpo-s3",
        active_deadline_s=7200,
        wait_timeout_s=60,
        poll_interval_s=1,
        client_configuration=api.configuration(),
    )
    fields.update(overrides)
    return TrainJobLaunch(**fields)


def _posted(api: KubeAPI) -> list[dict]:
    return [c["body"] for c in api.calls if c["method"] == "POST" and c["path"] == TRAINJOBS]


def _strict(schema):
    """The CRD schema as the API server applies it: fields it does not declare are pruned (dropped
    silently), so for a client they are errors. Objects that keep unknown fields stay open."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


@pytest.fixture(scope="module")
def trainjob_schema() -> dict:
    require_shared(f"crds/{CRD.name}")
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    assert (
        version["name"] == "v1alpha1"
        and "runtimePatches" in version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    )
    return _strict(version["schema"]["openAPIV3Schema"])


def test_job_name_is_the_run_and_task_and_a_dns_label():
    name = job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "Train (multi-node)")
    assert name == job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "Train (multi-node)")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40
    assert name.startswith("g2rpo-train-multi-node-")
    others = {job_name("other-run", "Train (multi-node)"), job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train")}
    assert name not in others and len(others) == 2


def test_launch_creates_a_valid_trainjob_waits_and_streams_node0():
    echoed = []
    with KubeAPI(TRAINING_RUNTIME, script=_complete_after(3)) as api:
        outcome = launch_trainjob(
            _launch(api),
            ["--checkpoint-uri", "s3://b/runs/r1/checkpoints"],
            config_yaml="train: {}\n",
            nodes=4,
            echo=echoed.append,
        )
    assert outcome.name == job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train") and not outcome.followed
    assert outcome.namespace == NAMESPACE
    (job,) = _posted(api)

    # the Trainer's API models keep every field (they drop unknown ones silently)
    assert models.TrainerV1alpha1TrainJob.from_dict(job).to_dict() == job

    spec = job["spec"]
    assert spec["runtimeRef"] == {"name": TRAINING_RUNTIME, "kind": "ClusterTrainingRuntime"}
    assert spec["activeDeadlineSeconds"] == 7200
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 4 and trainer["image"] == "ghcr.io/g2rpo/g2rpo:0.1.0"
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    # one process per GPU, whatever the Trainer's "auto" would make of the node's cores
    assert trainer["command"][:2] == ["bash", "-c"]
    assert "exec python -m g2rpo.launch.torchrun --nproc-per-node=8 -m g2rpo train" in trainer["command"][2]
    # output.dir on the runtime's shared volume, one folder per job (every rank writes into it)
    shared_dir = f"output.dir=/g2rpo-runs/{outcome.name}"
    assert trainer["command"][4:] == ["--checkpoint-uri", "s3://b/runs/r1/checkpoints", shared_dir]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env[CONFIG_ENV] == "train: {}\n" and env["AWS_ENDPOINT_URL"] == "http://seaweedfs.storage:8333"
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["name"] == "node"
    assert pod["nodeSelector"] == PLACEMENT.node_selector and pod["tolerations"] == PLACEMENT.tolerations
    assert pod["serviceAccountName"] == "g2rpo-trainer"
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Gi"}}]
    (container,) = pod["containers"]
    # No env in the patch: the Trainer's webhook refuses it; the runtime reads the Secret (test_trainer_check.py).
    assert container == {"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    assert "[node-0] rank 0: done" in echoed and echoed[-1].endswith("is Complete")

    # The API calls the launcher makes, as RBAC terms: the Helm chart's Role must grant them.
    recorded = rbac_calls(api.calls, NAMESPACE)
    rendered = json.dumps(recorded, indent=1) + "\n"
    if os.environ.get("G2RPO_UPDATE_FIXTURES") == "1":
        API_CALLS.write_text(rendered)
    assert API_CALLS.read_text() == rendered, (
        f"the launcher's Kubernetes API calls changed; review them (and the Helm chart's Role), then "
        f"regenerate {API_CALLS} with G2RPO_UPDATE_FIXTURES=1"
    )


def test_the_trainjob_matches_the_crd(trainjob_schema):
    with KubeAPI(TRAINING_RUNTIME, script=_complete_after(1)) as api:
        launch_trainjob(_launch(api), ["--checkpoint-uri", "s3://b/c"], config_yaml="{}", nodes=2, echo=lambda _: None)
    (job,) = _posted(api)
    jsonschema.validate(job, trainjob_schema)
    renamed = copy.deepcopy(job)
    renamed["spec"]["podTemplateOverrides"] = renamed["spec"].pop("runtimePatches")  # the field's earlier name
    with pytest.raises(jsonschema.ValidationError, match="podTemplateOverrides"):
        jsonschema.validate(renamed, trainjob_schema)


def test_sigterm_while_the_task_waits_deletes_its_job_and_says_so():
    # A run terminated through KFP: Argo signals the train task's container while the TrainJob trains. The job
    # (and with it the JobSet's pods) must not outlive the run.
    with KubeAPI(TRAINING_RUNTIME) as api:  # never finishes on its own
        echoed = []

        def signal_once_created(line: str) -> None:
            echoed.append(line)
            if line.startswith("started TrainJob"):
                threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()

        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=signal_once_created)
        assert signal.getsignal(signal.SIGTERM) is handler  # the task's own handling is back
    name = job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train")
    deletes = [c for c in api.calls if c["method"] == "DELETE"]
    assert [c["path"] for c in deletes] == [f"{TRAINJOBS}/{name}"] and api.jobs == {}
    assert deletes[0]["query"]["propagationPolicy"] == ["Foreground"]  # its JobSet and pods go before it does
    assert any(f"SIGTERM received while TrainJob team-a/{name} trains: deleting it" in line for line in echoed)
    message = str(info.value)
    assert "stopped by SIGTERM" in message and f"TrainJob team-a/{name} was deleted with its pods" in message
    assert "a retry of this task starts the job again and resumes from there" in message

    recorded = json.dumps(rbac_calls(api.calls, NAMESPACE), indent=1) + "\n"
    if os.environ.get("G2RPO_UPDATE_FIXTURES") == "1":
        API_CALLS_TERMINATED.write_text(recorded)
    assert API_CALLS_TERMINATED.read_text() == recorded, (
        f"the stopped launcher's Kubernetes API calls changed; review them (and the Helm chart's Role), then "
        f"regenerate {API_CALLS_TERMINATED} with G2RPO_UPDATE_FIXTURES=1"
    )


class _NoDelete(KubeAPI):
    """An API whose Role lacks delete on trainjobs (a chart older than this launcher)."""

    def _trainjobs(self, method, namespace, name, body):
        if method == "DELETE":
            return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "no"}
        return super()._trainjobs(method, namespace, name, body)


def test_sigterm_when_the_job_cannot_be_deleted_names_the_grant_and_the_command():
    with _NoDelete(TRAINING_RUNTIME) as api:

        def signal_once_created(line: str) -> None:
            if line.startswith("started TrainJob"):
                threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()

        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=signal_once_created)
    name = job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train")
    message = str(info.value)
    assert "could not be deleted (HTTP 403 Forbidden" in message and "needs delete on trainjobs" in message
    assert f"`kubectl delete trainjob -n team-a {name}` stops it" in message


def test_a_failed_job_fails_with_its_condition_message():
    failed = {"conditions": [condition("Failed", "node-2 exited with code 137 (OOMKilled)", "TrainingFailed")]}
    with KubeAPI(TRAINING_RUNTIME, script=lambda job, n: failed if n >= 2 else None) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=lambda _: None)
    message = str(info.value)
    assert (
        "team-a/g2rpo-train-" in message
        and "failed: TrainingFailed: node-2 exited with code 137 (OOMKilled)" in message
    )


def test_a_slow_job_times_out_with_a_clear_error():
    with KubeAPI(TRAINING_RUNTIME) as api:  # never finishes
        with pytest.raises(G2RPOError, match=r"did not finish within 3 s: .*activeDeadlineSeconds \(7200 s\)"):
            launch_trainjob(_launch(api, wait_timeout_s=3), [], config_yaml="{}", nodes=2, echo=lambda _: None)
    assert len(_posted(api)) == 1


def test_a_retried_task_follows_its_job_instead_of_starting_another():
    with KubeAPI(TRAINING_RUNTIME) as api:
        with pytest.raises(G2RPOError, match="did not finish within 2 s"):  # the first attempt gives up
            launch_trainjob(_launch(api, wait_timeout_s=2), [], config_yaml="{}", nodes=2, echo=lambda _: None)
        api.script = _complete_after(1)  # the job goes on and completes
        echoed = []
        outcome = launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=echoed.append)
        assert outcome.followed and echoed[0].startswith(f"following TrainJob team-a/{outcome.name}")
        assert len(_posted(api)) == 1 and list(api.jobs) == [outcome.name]
        # another task of the run is another job
        other = launch_trainjob(_launch(api, task="train-2"), [], config_yaml="{}", nodes=2, echo=lambda _: None)
        assert not other.followed and len(_posted(api)) == 2


def test_a_job_of_that_name_from_another_run_is_not_followed():
    with KubeAPI(TRAINING_RUNTIME, script=_complete_after(1)) as api:
        launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=lambda _: None)
        job = next(iter(api.jobs.values()))
        job["metadata"]["annotations"]["g2rpo.io/kfp-run-id"] = "someone-else"
        with pytest.raises(G2RPOError, match="exists but belongs to"):
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=lambda _: None)
    assert len(_posted(api)) == 1


def test_a_missing_runtime_is_named_with_the_fix():
    with KubeAPI("some-other-runtime") as api:
        with pytest.raises(
            G2RPOError, match=f"runtime='{TRAINING_RUNTIME}': no TrainingRuntime in team-a .*Helm chart"
        ):
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=lambda _: None)
    assert not api.jobs


def test_bad_launch_settings_are_listed_before_any_request():
    with KubeAPI(TRAINING_RUNTIME) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api, image="", poll_interval_s=0), [], config_yaml="{}", nodes=0, echo=print)
    assert all(f in str(info.value) for f in ("nodes=0", "image=''", "poll_interval_s=0"))
    assert api.calls == []


def test_the_train_step_with_several_nodes_launches_the_trainjob(tmp_path):
    from g2rpo.config import load_config, to_yaml
    from g2rpo.steps.train import train_and_publish
    from g2rpo.training.run_config import RunConfig

    repo = Path(__file__).resolve().parents[2]
    # 3 nodes × 8 GPUs: 24 ranks, each with whole prompt groups, under DeepSpeed
    fits = {"deepspeed": {"enabled": True}, "train": {"prompts_per_iteration": 24}}
    config = load_config(
        RunConfig, repo / "configs" / "tiny-cpu.yaml", {"output": {"dir": str(tmp_path / "run")}, **fits}
    )
    with pytest.raises(G2RPOError, match="nodes=2: more than one node trains as a Kubeflow TrainJob"):
        train_and_publish(config, nodes=2, checkpoint_uri="s3://b/runs/r1/checkpoints")
    with KubeAPI(TRAINING_RUNTIME, script=_complete_after(1)) as api:
        launch = _launch(api)
        with pytest.raises(G2RPOError, match="checkpoint_uri=None: a multi-node run mirrors its checkpoints"):
            train_and_publish(config, nodes=2, trainjob=launch)
        # What the job's world size asks (3 nodes × 8 GPUs = 24 ranks) is checked before any job exists: in the
        # pods it would fail once per JobSet restart (seen on the cluster tier, DeepSpeed left off).
        single = load_config(
            RunConfig,
            repo / "configs" / "tiny-cpu.yaml",
            {"output": {"dir": str(tmp_path / "run")}, "deepspeed": {"enabled": False}},
        )
        with pytest.raises(ConfigError) as refused:
            train_and_publish(single, nodes=3, trainjob=launch, checkpoint_uri="s3://b/runs/r1/checkpoints")
        assert "run config for 3 nodes (24 ranks)" in str(refused.value)
        assert "24 ranks need DeepSpeed" in str(refused.value) and "multiple of the world size 24" in str(refused.value)
        assert not _posted(api)
        result = train_and_publish(config, nodes=3, trainjob=launch, checkpoint_uri="s3://b/runs/r1/checkpoints")
    assert result.trainjob == job_name(launch.run_id, launch.task) and result.published is None
    (job,) = _posted(api)
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3
    assert trainer["command"][4:] == [
        "--checkpoint-uri",
        "s3://b/runs/r1/checkpoints",
        f"output.dir=/g2rpo-runs/{result.trainjob}",  # the runtime's shared volume
    ]
    assert {e["name"]: e["value"] for e in trainer["env"]}[CONFIG_ENV] == to_yaml(config)
    assert not (tmp_path / "run").exists()  # nothing trained here


def test_a_retry_after_a_job_that_used_up_its_restarts_starts_a_new_job_that_resumes():
    # Attempt 1 uses up its JobSet's restarts and stays Failed. A KFP retry of the task followed it by name
    # and failed at once; it starts attempt 2 instead: a new job, the same checkpoint mirror, a fresh output.dir.
    used_up = {
        "conditions": [
            condition(
                "Failed",
                "jobset failed due to reaching max number of restarts (first failed job: x-node-0)",
                "ReachedMaxRestarts",
            )
        ]
    }
    first = job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train")
    second = job_name("3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a", "train", attempt=2)
    assert second == f"{first}-a2" and len(second) <= 40

    def script(job, polls):
        if job["metadata"]["name"] == first and polls >= 2:
            return used_up
        return _complete_after(2)(job, polls) if job["metadata"]["name"] == second else None

    args = ["--checkpoint-uri", "s3://b/runs/r1/checkpoints"]
    with KubeAPI(TRAINING_RUNTIME, script=script) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api), args, config_yaml="train: {}\n", nodes=2, echo=lambda _: None)
        message = str(info.value)
        assert f"team-a/{first} (attempt 1) failed: ReachedMaxRestarts: jobset failed due to reaching max" in message
        assert f"retrying this task starts attempt 2 (TrainJob {second}), which resumes from there" in message

        echoed = []  # the KFP retry: a new pod, the same run and task
        outcome = launch_trainjob(_launch(api), args, config_yaml="train: {}\n", nodes=2, echo=echoed.append)
        assert (outcome.name, outcome.attempt, outcome.followed) == (second, 2, False)
        assert any(f"{first} (attempt 1) failed (ReachedMaxRestarts" in line for line in echoed), echoed
        assert any(line.startswith(f"started TrainJob team-a/{second}") and "attempt 2" in line for line in echoed)
        assert echoed[-1].endswith("is Complete")

        # A further retry follows the completed attempt 2; nothing else is created, nothing is deleted.
        again = launch_trainjob(_launch(api), args, config_yaml="train: {}\n", nodes=2, echo=lambda _: None)
        assert (again.name, again.attempt, again.followed) == (second, 2, True)
    one, two = _posted(api)
    assert [one["metadata"]["name"], two["metadata"]["name"]] == [first, second]
    # The same checkpoint mirror (it resumes from the newest complete checkpoint there) in a fresh output.dir.
    assert one["spec"]["trainer"]["command"][4:] == [*args, f"output.dir=/g2rpo-runs/{first}"]
    assert two["spec"]["trainer"]["command"][4:] == [*args, f"output.dir=/g2rpo-runs/{second}"]
    assert two["metadata"]["annotations"] == one["metadata"]["annotations"]  # the same run and task
    assert {c["method"] for c in api.calls} == {"GET", "POST"}
    # The chart's Role grants exactly the recorded calls (tests/chart/test_chart_rbac.py): a retry needs no more.
    assert set(map(json.dumps, rbac_calls(api.calls, NAMESPACE))) <= set(
        map(json.dumps, json.loads(API_CALLS.read_text()))
    )


def test_a_task_whose_attempts_all_failed_starts_no_more_jobs():
    failed = {
        "conditions": [
            condition("Failed", "jobset failed due to reaching max number of restarts", "ReachedMaxRestarts")
        ]
    }
    with KubeAPI(TRAINING_RUNTIME, script=lambda job, polls: failed) as api:
        launch = _launch(api)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            name = job_name(launch.run_id, launch.task, attempt)
            api.jobs[name] = {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "annotations": {"g2rpo.io/kfp-run-id": launch.run_id, "g2rpo.io/kfp-task": launch.task},
                },
            }
        with pytest.raises(G2RPOError, match=f"the TrainJobs of all {MAX_ATTEMPTS} attempts of task 'train'"):
            launch_trainjob(launch, [], config_yaml="{}", nodes=2, echo=lambda _: None)
    assert not _posted(api)


def test_a_job_failed_on_the_usage_status_says_so_and_why_it_was_not_restarted():
    # What the chart's runtime does on a bad model path (exit 2): the Job fails on its podFailurePolicy and the
    # JobSet's rule TrainerUsageError fails the JobSet at once; the Trainer copies JobSet v0.12's condition.
    failed = {
        "conditions": [
            condition(
                "Failed",
                "applying FailJobSet failure policy action (first failed job: g2rpo-train-x-node-0)",
                "FailJobSetFailurePolicyAction",
            )
        ]
    }
    with KubeAPI(TRAINING_RUNTIME, script=lambda job, n: failed if n >= 2 else None) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api), [], config_yaml="{}", nodes=2, echo=lambda _: None)
    message = str(info.value)
    assert "(attempt 1) failed: FailJobSetFailurePolicyAction: applying FailJobSet failure policy action" in message
    assert "the trainer exited with status 2, a usage or configuration error" in message
    assert "failure rule TrainerUsageError failed the job at once instead of restarting it" in message
    assert "Fix what the log names" in message and "retrying this task starts attempt 2" in message
