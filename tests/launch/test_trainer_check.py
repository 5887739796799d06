"""The launcher's TrainJob through Kubeflow Trainer v2.3.0's own admission checks and JobSet build.

``../shared/tools/trainer-check`` runs the Trainer controller's runtimes and the TrainJob validating
webhook's checks on a TrainJob and a runtime, and writes the JobSet the reconciler would apply
(``../shared/tools/README.md``). Here the TrainJob is the one the real launcher POSTs to the loopback API
(which serves the chart's rendered ``ClusterTrainingRuntime``, so the launcher's own runtime check reads it
too), for the chart's value sets and the placements the tests use; what each node's pod gets is read from
the JobSet, i.e. as the Trainer applies the runtime and the job's patches, not from our builder's fields.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubeapi import KubeAPI, condition

from g2rpo.errors import USAGE_EXIT_STATUS, G2RPOError
from g2rpo.launch.trainjob import (
    LABEL_RUN,
    NODE_RUN_DIR,
    TRAINING_RUNTIME,
    USAGE_FAILURE_RULE,
    Placement,
    TrainJobLaunch,
    launch_trainjob,
)
from g2rpo.steps.placement import load_profile
from tests.chart.chart_render import CRD_DIR, VALUE_SETS, closed, training_runtime
from tests.shared_checkout import require_shared, shared_path

TOOL = shared_path("tools/trainer-check")
NAMESPACE = "team-a"
IMAGE = "ghcr.io/g2rpo/g2rpo-trainer:0.1.0"

pytestmark = pytest.mark.skipif(
    not TOOL.is_file(), reason=f"../shared/tools/trainer-check is not beside this checkout ({TOOL}); CI has it"
)

PROFILE = load_profile()
PLACEMENTS = {
    # The pipeline's default profile, as the train component passes it (g2rpo/steps/profiles/h200.yaml).
    "h200-profile": Placement(
        gpus_per_node=PROFILE.gpus_per_node,
        node_selector=PROFILE.node_selector,
        tolerations=PROFILE.tolerations,
        shm_size=PROFILE.shm_size,
        service_account=PROFILE.service_account,
    ),
    # tests/launch/test_trainjob.py's placement.
    "h200-trainer-account": Placement(
        gpus_per_node=8,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        shm_size="128Gi",
        service_account="g2rpo-trainer",
    ),
    # A run that picks another pool and GPU count (the backend tier's override run).
    "b200-4-gpus": Placement(
        gpus_per_node=4,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-B200", "pool": "b200"},
        tolerations=[
            *PROFILE.tolerations,
            {"key": "dedicated", "operator": "Equal", "value": "alignment", "effect": "NoSchedule"},
        ],
        shm_size="512Gi",
        service_account=PROFILE.service_account,
    ),
}
# (chart value set, placement, nodes): every value set that installs the runtime, each placement.
CASES = [
    ("defaults", "h200-profile", 1),  # the defaults give no shared volume: one node only (test below)
    ("everything_on", "h200-trainer-account", 4),
    ("multi_node", "b200-4-gpus", 2),
    ("multi_node", "h200-profile", 4),
]


@pytest.fixture(scope="module")
def jobset_schema() -> dict:
    require_shared("crds/jobset.x-k8s.io_jobsets.yaml")
    crd = yaml.safe_load((CRD_DIR / "jobset.x-k8s.io_jobsets.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return closed(version["schema"]["openAPIV3Schema"])


def _launch(api: KubeAPI, placement: Placement, **overrides) -> TrainJobLaunch:
    fields = dict(
        image=IMAGE,
        run_id="3f1c2a9e-0d4b-4c1e-9a55-7e2b8f1d6c0a",
        task="train",
        namespace=NAMESPACE,
        placement=placement,
        s3_secret=PROFILE.s3_secret_name,
        s3_secret_keys=PROFILE.s3_secret_keys,
        active_deadline_s=7200,
        wait_timeout_s=30,
        poll_interval_s=1,
        client_configuration=api.configuration(),
    )
    fields.update(overrides)
    return TrainJobLaunch(**fields)


def _posted_trainjob(runtime: dict, placement: Placement, nodes: int) -> dict:
    complete = {"conditions": [condition("Complete", "all nodes succeeded")]}
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime, script=lambda job, polls: complete) as api:
        launch_trainjob(_launch(api, placement), [], config_yaml="train: {}\n", nodes=nodes, echo=lambda _: None)
    (job,) = [c["body"] for c in api.calls if c["method"] == "POST"]
    job["metadata"].setdefault("namespace", NAMESPACE)  # as the API server fills it from the request path
    return job


def trainer_check(job: dict, runtime: dict, folder: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run the tool; its output and the JobSet it built (None when refused)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainjob.yaml").write_text(yaml.safe_dump(job))
    (folder / "runtime.yaml").write_text(yaml.safe_dump(runtime))
    jobset = folder / "jobset.yaml"
    done = subprocess.run(
        [str(TOOL), str(folder / "trainjob.yaml"), str(folder / "runtime.yaml"), str(jobset)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, yaml.safe_load(jobset.read_text()) if done.returncode == 0 and jobset.exists() else None


@pytest.mark.parametrize("values, placement_name, nodes", CASES)
def test_the_launchers_trainjob_is_admitted_and_its_pods_get_the_runs_placement(
    values, placement_name, nodes, tmp_path, jobset_schema
):
    runtime = training_runtime(VALUE_SETS[values])
    placement = PLACEMENTS[placement_name]
    job = _posted_trainjob(runtime, placement, nodes)

    done, jobset = trainer_check(job, runtime, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ADMITTED" in done.stdout + done.stderr

    (node,) = jobset["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    assert node["template"]["spec"]["parallelism"] == nodes and node["template"]["spec"]["completions"] == nodes
    pod = node["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    gpus = str(placement.gpus_per_node)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert container["image"] == IMAGE
    assert pod["nodeSelector"] == placement.node_selector
    assert pod["tolerations"] == placement.tolerations
    assert pod["serviceAccountName"] == placement.service_account
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": placement.shm_size}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    endpoint = VALUE_SETS[values].get("s3", {}).get("endpoint")
    for key, variable in PROFILE.s3_secret_keys.items():  # through the runtime, from the profile's Secret
        if variable == "AWS_ENDPOINT_URL_S3" and endpoint:  # the chart's s3.endpoint, a plain value
            assert env[variable] == {"name": variable, "value": endpoint}
            continue
        assert env[variable]["valueFrom"]["secretKeyRef"]["name"] == PROFILE.s3_secret_name, variable
        assert env[variable]["valueFrom"]["secretKeyRef"]["key"] == key, variable
    # The Trainer's torch plugin: torchrun's rendezvous across the job's nodes.
    assert env["PET_NNODES"]["value"] == str(nodes)
    assert env["PET_MASTER_PORT"]["value"] == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert f"exec python -m g2rpo.launch.torchrun --nproc-per-node={gpus} -m g2rpo train" in container["command"][2]
    # Restarts: a lost pod fails its Job (backoffLimit 0) and the JobSet restarts the group, resuming.
    assert node["template"]["spec"]["backoffLimit"] == 0 and jobset["spec"]["failurePolicy"]["maxRestarts"] == 3
    # ... except on the trainer's usage status (exit 2 in every attempt): the Job fails at once on it and the
    # JobSet fails on that reason, as the runtime says (the Trainer copies both into the JobSet it builds).
    (exit_rule,) = node["template"]["spec"]["podFailurePolicy"]["rules"]
    assert exit_rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "node", "operator": "In", "values": [USAGE_EXIT_STATUS]},
    }
    (jobset_rule,) = jobset["spec"]["failurePolicy"]["rules"]
    assert jobset_rule["name"] == USAGE_FAILURE_RULE and jobset_rule["action"] == "FailJobSet"
    assert jobset_rule["onJobFailureReasons"] == ["PodFailurePolicy"] and jobset_rule["targetReplicatedJobs"] == [
        "node"
    ]
    # The JobSet as the API server would store it: its CRD's schema, fields it does not declare refused.
    jsonschema.validate(jobset, jobset_schema)
    assert "python -m g2rpo.launch.torchrun" in container["command"][2]  # the command that keeps status 2
    if nodes > 1:  # output.dir on the volume every node mounts, one folder per job
        shared = VALUE_SETS[values]["trainingRuntime"]["sharedVolume"]
        mount = shared.get("mountPath", "/g2rpo-runs")
        assert container["command"][-1] == f"output.dir={mount}/{job['metadata']['name']}"
        assert {"name": "runs", "mountPath": mount} in container["volumeMounts"]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": shared["claimName"]}} in pod["volumes"]
        assert env["G2RPO_RUNS_DIR"] == {"name": "G2RPO_RUNS_DIR", "value": mount}
    # The run's identity reaches the JobSet, its Job template and every pod (the TrainJob's own labels do not).
    identity = job["metadata"]["labels"]
    assert identity[LABEL_RUN] and identity["app.kubernetes.io/part-of"] == "g2rpo"
    for where, metadata in (
        ("jobset", jobset["metadata"]),
        ("job template", node["template"]["metadata"]),
        ("pod template", node["template"]["spec"]["template"]["metadata"]),
    ):
        assert identity.items() <= (metadata.get("labels") or {}).items(), (where, metadata)


def test_env_in_the_runtime_patches_is_refused_as_the_webhook_did(tmp_path):
    # What the launcher sent before: the Secret's env patched into container "node". The Trainer refuses it.
    runtime = training_runtime(VALUE_SETS["multi_node"])
    job = _posted_trainjob(runtime, PLACEMENTS["h200-profile"], 2)
    patched = copy.deepcopy(job)
    pod = patched["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    (container,) = pod["template"]["spec"]["template"]["spec"]["containers"]
    container["env"] = [
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "g2rpo-s3", "key": "AWS_ACCESS_KEY_ID"}}}
    ]
    done, jobset = trainer_check(patched, runtime, tmp_path)
    assert done.returncode == 1 and jobset is None
    assert "REFUSED (HTTP 403)" in done.stdout + done.stderr
    assert (
        "must not have envs for the dataset-initializer, model-initializer, node containers"
        in done.stdout + done.stderr
    )


def test_a_runtime_that_reads_another_secret_is_refused_before_any_job():
    # The chart installed with another Secret than the profile's: the pods would have no S3 credentials.
    runtime = training_runtime({"s3": {"existingSecret": "team-s3", "endpoint": "http://minio.minio.svc:9000"}})
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(_launch(api, PLACEMENTS["h200-profile"]), [], config_yaml="{}", nodes=2, echo=print)
    message = str(info.value)
    assert f"runtime='{TRAINING_RUNTIME}'" in message
    assert "AWS_ACCESS_KEY_ID: read from Secret 'team-s3', not 'g2rpo-s3'" in message
    assert "s3.existingSecret=g2rpo-s3" in message
    assert not [c for c in api.calls if c["method"] == "POST"]


def test_a_runtime_without_a_shared_volume_trains_several_nodes_in_folders_of_their_own_with_an_s3_mirror(
    tmp_path, jobset_schema
):
    # The chart's defaults (no shared volume), a run that mirrors its checkpoints to S3: each node's
    # output.dir is an emptyDir of its own pod (output.node_local=true), and S3 the store they share.
    runtime = training_runtime({})
    mirror = ["--checkpoint-uri", "s3://b/runs/r1/checkpoints"]
    complete = {"conditions": [condition("Complete", "all nodes succeeded")]}
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime, script=lambda job, polls: complete) as api:
        launch_trainjob(_launch(api, PLACEMENTS["h200-profile"]), mirror, config_yaml="{}", nodes=2, echo=print)
    (job,) = [c["body"] for c in api.calls if c["method"] == "POST"]
    job["metadata"].setdefault("namespace", NAMESPACE)
    name = job["metadata"]["name"]
    assert job["spec"]["trainer"]["command"][4:] == [
        *mirror,
        f"output.dir={NODE_RUN_DIR}/{name}",
        "output.node_local=true",
    ]

    # As the Trainer builds the node pods: the folder is an emptyDir of each pod, mounted in the node container.
    done, jobset = trainer_check(job, runtime, tmp_path)
    assert done.returncode == 0 and "ADMITTED" in done.stdout + done.stderr, done.stdout + done.stderr
    jsonschema.validate(jobset, jobset_schema)
    (node,) = jobset["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v["name"] not in ("dshm",)]
    assert volume == {"name": "node-run", "emptyDir": {}}
    assert {"name": "node-run", "mountPath": NODE_RUN_DIR} in container["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert "G2RPO_RUNS_DIR" not in {e["name"] for e in container["env"]}

    # A mirror that is a folder is no more shared than output.dir would be: refused, naming it and the fix.
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime) as api:
        with pytest.raises(G2RPOError) as info:
            launch_trainjob(
                _launch(api, PLACEMENTS["h200-profile"]),
                ["--checkpoint-uri", "file:///runs/r1/checkpoints"],
                config_yaml="{}",
                nodes=2,
                echo=print,
            )
    message = str(info.value)
    assert "checkpoint_uri='file:///runs/r1/checkpoints'" in message and "give an s3:// URI" in message
    assert "trainingRuntime.sharedVolume.claimName" in message
    assert not [c for c in api.calls if c["method"] == "POST"]


def test_a_runtime_without_a_shared_volume_is_refused_for_several_nodes_before_any_job():
    # Two pods have two file systems: rank 1 could not write its part of a checkpoint into rank 0's
    # output.dir (seen on the cluster tier: each TrainJob pod has its own /tmp). One node needs no volume.
    runtime = training_runtime({})
    for mounted_elsewhere in (False, True):
        if mounted_elsewhere:  # the variable names a folder where no volume is mounted
            (container,) = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
                "spec"
            ]["containers"]
            container["env"].append({"name": "G2RPO_RUNS_DIR", "value": "/runs"})
        with KubeAPI(TRAINING_RUNTIME, runtime=runtime) as api:
            with pytest.raises(G2RPOError) as info:
                launch_trainjob(_launch(api, PLACEMENTS["h200-profile"]), [], config_yaml="{}", nodes=2, echo=print)
        message = str(info.value)
        assert "has no folder its nodes share" in message and "trainingRuntime.sharedVolume.claimName" in message
        assert "the run has no checkpoint mirror" in message and "s3:// checkpoint URI (--checkpoint-uri" in message
        assert ("'/runs', where no volume is mounted" in message) == mounted_elsewhere
        assert not [c for c in api.calls if c["method"] == "POST"]
