"""The committed pipeline through Kubeflow Pipelines' real backend (2.17.0): what each task's pod gets.

``../shared/tools/kfp-backend-check`` is the backend's own Go code (the API server's upload and
create-run path, ``argocompiler.Compile``, Argo's validator, the driver's pod-spec patch and CEL
evaluator; ``../shared/tools/README.md``). The compile test diffs the YAML; this tier reads the pod-level
truth from what the backend makes of it, for the defaults and for run-time parameters an operator
overrides (another pool, extra tolerations, another GPU count, one node and several).

The tool's driver step runs for train, evaluate, prepare data and decide. Promote's inputs come from
upstream outputs and the exit task's from the run's final status, both read from ML Metadata, which the
tool has no server for (it crashes on them); for those two the test reads the ``kubernetes-config``
the compiled Argo workflow hands their driver, which is what the driver turns into the patch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from components.images import G2RPO_IMAGE, TRAINER_IMAGE
from g2rpo.steps.placement import load_profile
from g2rpo.steps.train_pod import size_train_pod
from tests.shared_checkout import shared_path

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "pipelines" / "compiled" / "alignment.yaml"
TOOL = shared_path("tools/kfp-backend-check")
DRIVEN = ("train", "evaluate", "prepare data", "decide")  # tasks whose driver step the tool runs

pytestmark = pytest.mark.skipif(
    not TOOL.is_file(), reason=f"../shared/tools/kfp-backend-check is not beside this checkout ({TOOL}); CI has it"
)

PROFILE = load_profile()
S3_ENV = {
    variable: {"key": key, "name": PROFILE.s3_secret_name, "optional": False}
    for key, variable in PROFILE.s3_secret_keys.items()
}
B200_POOL = {"nvidia.com/gpu.product": "NVIDIA-B200", "pool": "b200"}
EXTRA_TOLERATIONS = [
    *PROFILE.tolerations,
    {"key": "dedicated", "operator": "Equal", "value": "alignment", "effect": "NoSchedule"},
]
# Run-time parameters as a run request carries them (`g2rpo pipeline submit` turns gpus_per_node=4 into "4"
# and sizes the train pod from nodes: g2rpo/steps/train_pod.py).
RUNS = {
    name: size_train_pod(parameters, PROFILE)
    for name, parameters in {
        "defaults": {},
        "b200-pool-4-gpus-2-nodes": {
            "node_selector": B200_POOL,
            "tolerations": EXTRA_TOLERATIONS,
            "gpus_per_node": "4",
            "nodes": 2,
        },
        "one-node-1-gpu": {"gpus_per_node": "1", "nodes": 1},
    }.items()
}


@dataclass
class Backend:
    """What one run of the tool said: exit status, output, pod spec patches and the Argo workflow."""

    returncode: int
    output: str
    patches: dict[str, dict]
    workflow: dict

    def driver_config(self, task: str) -> dict:
        """The ``kubernetes-config`` argument the workflow passes to ``task``'s driver."""
        return json.loads(self.driver_arguments(task)["kubernetes-config"])

    def driver_arguments(self, task: str) -> dict[str, str]:
        for dag_task in self._dag_tasks():
            arguments = self._arguments(dag_task)
            if "container" in arguments and json.loads(arguments["task"])["taskInfo"]["name"] == task:
                return arguments
        raise AssertionError(f"no driver for task {task!r} in the workflow")

    def executor_arguments(self, task: str) -> tuple[str, dict[str, str]]:
        """The template and arguments of the Argo task that runs ``task``'s container (after its driver)."""
        driver = next(t["name"] for t in self._dag_tasks() if self._is_driver_of(t, task))
        executor = next(t for t in self._dag_tasks() if t.get("depends") == f"{driver}.Succeeded")
        return executor["template"], self._arguments(executor)

    def template(self, name: str) -> dict:
        return next(t for t in self.workflow["spec"]["templates"] if t["name"] == name)

    def _is_driver_of(self, dag_task: dict, task: str) -> bool:
        arguments = self._arguments(dag_task)
        return "container" in arguments and json.loads(arguments["task"])["taskInfo"]["name"] == task

    def _dag_tasks(self) -> list[dict]:
        return [task for t in self.workflow["spec"]["templates"] if "dag" in t for task in t["dag"]["tasks"]]

    def _arguments(self, dag_task: dict) -> dict[str, str]:
        globals_ = {p["name"]: p.get("value") for p in self.workflow["spec"]["arguments"]["parameters"]}
        out = {}
        for parameter in dag_task.get("arguments", {}).get("parameters", []):
            value = str(parameter.get("value", ""))
            match = re.fullmatch(r"\{\{workflow\.parameters\.([^}]+)\}\}", value)
            out[parameter["name"]] = str(globals_[match.group(1)]) if match else value
        return out


def run_backend(out: Path, parameters: dict | None = None) -> Backend:
    env = {key: value for key, value in os.environ.items() if key != "KFP_CHECK_PARAMS"}
    if parameters:
        env["KFP_CHECK_PARAMS"] = json.dumps(parameters)
    done = subprocess.run(
        [str(TOOL), str(COMPILED), str(out), *DRIVEN], env=env, capture_output=True, text=True, timeout=120
    )
    patches = {
        task: json.loads((out / f"podspecpatch.{task}.json").read_text())
        for task in DRIVEN
        if (out / f"podspecpatch.{task}.json").exists()
    }
    workflow_file = out / "workflow.defaults.yaml"
    workflow = yaml.safe_load(workflow_file.read_text()) if workflow_file.exists() else {}
    return Backend(done.returncode, done.stdout + done.stderr, patches, workflow)


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory) -> tuple[dict, Backend]:
    parameters = RUNS[request.param]
    return parameters, run_backend(tmp_path_factory.mktemp(request.param), parameters)


def _container(patch: dict) -> dict:
    (container,) = patch["containers"]
    assert container["name"] == "main"
    return container


def _secret_env(container: dict) -> dict:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e}


def test_every_check_of_the_backend_passes(run):
    _, backend = run
    assert backend.returncode == 0, backend.output
    assert "ALL CHECKS PASSED" in backend.output
    assert set(backend.patches) == set(DRIVEN)


def test_the_train_pod_gets_its_gpus_resources_and_placement(run):
    parameters, backend = run
    patch = backend.patches["train"]
    container = _container(patch)
    gpus = parameters.get("gpus_per_node", str(PROFILE.gpus_per_node))
    # The driver reads resourceCpuLimit/resourceMemoryLimit (not the old cpuLimit/memoryLimit).
    if parameters.get("nodes", 1) > 1:
        # It only creates and watches the TrainJob, whose pods get the GPUs: no GPU here, sized for waiting.
        assert container["resources"] == {"limits": {PROFILE.accelerator_type: "0", "cpu": "1", "memory": "4Gi"}}
    else:
        assert container["resources"] == {
            "limits": {PROFILE.accelerator_type: gpus, "cpu": PROFILE.cpu_limit, "memory": PROFILE.memory_limit}
        }
    assert container["image"] == TRAINER_IMAGE
    assert patch["nodeSelector"] == parameters.get("node_selector", PROFILE.node_selector)
    assert patch["tolerations"] == parameters.get("tolerations", PROFILE.tolerations)
    assert _secret_env(container) == S3_ENV
    assert patch["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": PROFILE.shm_size}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert patch["activeDeadlineSeconds"] == PROFILE.timeouts.train


def test_the_evaluate_pod_gets_one_gpu_on_the_runs_pool(run):
    parameters, backend = run
    patch = backend.patches["evaluate"]
    container = _container(patch)
    assert container["resources"] == {"limits": {PROFILE.accelerator_type: str(PROFILE.evaluate_gpus)}}
    assert container["image"] == TRAINER_IMAGE
    assert patch["nodeSelector"] == parameters.get("node_selector", PROFILE.node_selector)
    assert patch["tolerations"] == parameters.get("tolerations", PROFILE.tolerations)
    assert _secret_env(container) == S3_ENV and patch["activeDeadlineSeconds"] == PROFILE.timeouts.evaluate
    assert "volumes" not in patch


@pytest.mark.parametrize("task, deadline", [("prepare data", "prepare"), ("decide", "decide")])
def test_the_cpu_tasks_get_the_secret_and_their_deadline_and_no_placement(run, task, deadline):
    _, backend = run
    patch = backend.patches[task]
    container = _container(patch)
    assert container["image"] == G2RPO_IMAGE and container["resources"] == {}
    assert _secret_env(container) == S3_ENV
    assert patch["activeDeadlineSeconds"] == getattr(PROFILE.timeouts, deadline)
    assert not {"nodeSelector", "tolerations", "volumes"} & set(patch)


@pytest.mark.parametrize("task, deadline", [("promote", "promote"), ("report status", "report")])
def test_promote_and_the_exit_task_get_the_secret_and_their_deadline(run, task, deadline):
    _, backend = run
    config = backend.driver_config(task)
    assert int(config["activeDeadlineSeconds"]) == getattr(PROFILE.timeouts, deadline)
    (secret,) = config["secretAsEnv"]
    assert secret["secretName"] == PROFILE.s3_secret_name and not secret["optional"]
    assert {m["envVar"]: m["secretKey"] for m in secret["keyToEnv"]} == {
        v: k for k, v in PROFILE.s3_secret_keys.items()
    }
    assert not {"nodeSelector", "tolerations", "emptyDirMounts"} & set(config)


def test_the_train_pod_carries_the_scrape_labels(run):
    _, backend = run
    template, arguments = backend.executor_arguments("train")
    labels = {
        arguments[f"pod-metadata-label-key-{i}"]: arguments[f"pod-metadata-label-val-{i}"]
        for i in range(1, len(PROFILE.pod_labels) + 1)
    }
    assert labels == PROFILE.pod_labels
    pod_labels = backend.template(backend.template(template)["dag"]["tasks"][0]["template"])["metadata"]["labels"]
    assert (
        pod_labels["{{inputs.parameters.pod-metadata-label-key-1}}"] == "{{inputs.parameters.pod-metadata-label-val-1}}"
    )


@pytest.mark.parametrize(
    "task, retried",
    [
        ("prepare data", True),
        ("train", True),
        ("evaluate", True),
        ("report status", True),
        ("decide", False),
        ("promote", False),
    ],
)
def test_only_tasks_safe_to_rerun_retry_with_backoff(run, task, retried):
    _, backend = run
    template, arguments = backend.executor_arguments(task)
    impl = backend.template(backend.template(template)["dag"]["tasks"][0]["template"])
    assert ("retryStrategy" in impl) == retried, task
    if retried:
        assert {k: arguments[k] for k in arguments if k.startswith("retry-")} == {
            "retry-max-count": "2",
            "retry-backoff-duration": "60",
            "retry-backoff-factor": "2",
            "retry-backoff-max-duration": "3600",
        }


def test_promote_runs_only_when_the_gates_pass(run):
    _, backend = run
    verdicts = re.findall(
        r'\[condition\] [^ ]+ \("gates-passed"\) .* with inputs=(true|false) -> runs=(true|false)', backend.output
    )
    assert sorted(verdicts) == [("false", "false"), ("true", "true")]
    gate = next(
        t
        for tmpl in backend.workflow["spec"]["templates"]
        if "dag" in tmpl
        for t in tmpl["dag"]["tasks"]
        if t["name"] == "condition-2-driver"
    )
    assert "decide.Succeeded" in gate["depends"]


def test_a_run_without_a_service_account_runs_as_pipeline_runner(run):
    # Why submit and schedule always send the profile's (tests/pipeline/test_pipeline_submit.py).
    _, backend = run
    assert backend.workflow["spec"]["serviceAccountName"] == "pipeline-runner"


def test_the_api_server_refuses_a_number_for_the_gpu_count(tmp_path):
    # A string parameter: the number 4 is refused at run creation, before any pod (submit sends "4").
    backend = run_backend(tmp_path, {"gpus_per_node": 4})
    assert backend.returncode == 1
    assert "input parameter gpus_per_node requires type string" in backend.output
