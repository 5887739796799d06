"""A task of ``pipelines/compiled/alignment.yaml`` as the pod KFP 2.17 would start for it.

From the compiled YAML alone: the task's parameters resolved as KFP's driver resolves them (pipeline inputs
over their defaults, runtime constants with the ``{{$.pipeline_job_name}}``-style placeholders filled in,
upstream outputs), its input artifacts (the producers' URIs and metadata) and output artifacts (URIs under
the pipeline root: ``<root>/<pipeline name>/<run id>/<task>/<output>``) as the executor input the launcher
writes; and the pod: the compiled container's image, command and arguments unchanged, wrapped by the
launcher (:mod:`tests.cluster.kfp_launch`) as KFP wraps them, with the executor template of KFP's Argo
compiler (scratch ``emptyDir`` volumes, the container's security context, ``KFP_POD_NAME``) and the driver's
pod-spec patch from the platform spec (the Secret's keys as env, deadline, node selector, tolerations,
``emptyDir`` mounts, CPU/memory/accelerator limits, pod labels).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

COMPILED = Path(__file__).resolve().parents[2] / "pipelines" / "compiled" / "alignment.yaml"
OUTPUT_FILE = "/tmp/kfp_outputs/output_metadata.json"  # where KFP's launcher asks the executor for its output
LAUNCHER_DIR = "/kfp-launcher"
# KFP's Argo compiler: the executor pod's scratch volumes (writable by a non-root user), in its order.
SCRATCH = {
    "gcs-scratch": "/gcs",
    "s3-scratch": "/s3",
    "minio-scratch": "/minio",
    "dot-local-scratch": "/.local",
    "dot-cache-scratch": "/.cache",
    "dot-config-scratch": "/.config",
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass
class CompiledPipeline:
    spec: dict
    platform: dict

    @classmethod
    def load(cls, path: Path = COMPILED) -> CompiledPipeline:
        docs = list(yaml.safe_load_all(path.read_text()))
        return cls(docs[0], docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"])

    @property
    def name(self) -> str:
        return self.spec["pipelineInfo"]["name"]

    def defaults(self) -> dict[str, Any]:
        params = self.spec["root"]["inputDefinitions"]["parameters"]
        out = {}
        for name, p in params.items():
            value = p.get("defaultValue")
            out[name] = _typed(value, p["parameterType"])
        return out

    def task(self, name: str) -> dict:
        """A container task, wherever it sits in the DAG (the root's exit task, the exit handler, the gate's condition)."""
        for component in [self.spec["root"], *self.spec["components"].values()]:
            tasks = component.get("dag", {}).get("tasks", {})
            if name in tasks and "comp-" + name == tasks[name]["componentRef"]["name"]:
                return tasks[name]
        raise KeyError(f"no container task {name!r} in {COMPILED.name}")

    def component(self, task: str) -> dict:
        return self.spec["components"]["comp-" + task]

    def executor(self, task: str) -> dict:
        return self.spec["deploymentSpec"]["executors"][self.component(task)["executorLabel"]]["container"]


def _typed(value: Any, parameter_type: str) -> Any:
    """A parameter value as the driver hands it on (protobuf numbers come as floats in the YAML)."""
    if parameter_type == "NUMBER_INTEGER" and isinstance(value, float):
        return int(value)
    if parameter_type == "LIST" and isinstance(value, list):
        return [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]
    return value


@dataclass
class Run:
    """One run of the compiled pipeline: its arguments, identity, pipeline root and finished tasks."""

    pipeline: CompiledPipeline
    arguments: dict[str, Any]
    run_id: str
    job_name: str
    pipeline_root: str  # s3://bucket/prefix
    outputs: dict[str, dict] = field(default_factory=dict)  # task -> the launcher's record
    # What the exit task is told about the exit handler: KFP 2.17's driver passes ML Metadata's state of its DAG
    # execution (COMPLETE when every task in it succeeded), not Vertex AI's SUCCEEDED.
    final_state: str = "COMPLETE"

    def __post_init__(self):
        unknown = sorted(set(self.arguments) - set(self.pipeline.defaults()))
        if unknown:
            raise ValueError(f"arguments {unknown} are not parameters of {self.pipeline.name}")

    def parameter(self, name: str) -> Any:
        return {**self.pipeline.defaults(), **self.arguments}[name]

    def _channel(self, name: str) -> Any:
        return self.parameter(name.removeprefix("pipelinechannel--"))

    def _placeholders(self, text: str, task: str, inputs: dict[str, Any]) -> Any:
        def one(match: re.Match) -> str:
            key = match.group(1)
            if key == "pipeline_job_name":
                return self.job_name
            if key == "pipeline_job_uuid":
                return self.run_id
            if key == "pipeline_task_name":
                return task
            param = re.fullmatch(r"inputs\.parameters\['([^']+)'\]", key)
            if param:
                return str(inputs[param.group(1)])
            raise ValueError(f"placeholder {{{{$.{key}}}}} in task {task} is not one the driver fills")

        return re.sub(r"\{\{\$\.([^}]+)\}\}", one, text)

    def parameters(self, task: str) -> dict[str, Any]:
        spec = self.pipeline.task(task)["inputs"].get("parameters", {})
        channels = {
            n: self._channel(s["componentInputParameter"]) for n, s in spec.items() if "componentInputParameter" in s
        }
        out = dict(channels)
        for name, source in spec.items():
            if "taskFinalStatus" in source:  # as the driver resolves it: protojson of PipelineTaskFinalStatus
                out[name] = {
                    "state": self.final_state,
                    "pipelineJobResourceName": self.job_name,
                    "pipelineTaskName": source["taskFinalStatus"]["producerTask"],
                    "error": {},
                }
            if "runtimeValue" in source:
                value = source["runtimeValue"]["constant"]
                out[name] = self._placeholders(value, task, channels) if isinstance(value, str) else value
        types = self.pipeline.component(task)["inputDefinitions"].get("parameters", {})
        return {n: _typed(v, types[n]["parameterType"]) if n in types else v for n, v in out.items()}

    def _artifact_source(self, task: str, source: dict) -> tuple[str, str]:
        if "taskOutputArtifact" in source:
            return source["taskOutputArtifact"]["producerTask"], source["taskOutputArtifact"]["outputArtifactKey"]
        # Inside the gate's condition: pipelinechannel--<producer>-<key>, bound by the parent DAG.
        channel = source["componentInputArtifact"].removeprefix("pipelinechannel--")
        for producer in self.outputs:
            if channel.startswith(producer + "-"):
                return producer, channel[len(producer) + 1 :]
        raise KeyError(f"task {task}: no finished producer for {source}")

    def executor_input(self, task: str) -> dict:
        inputs: dict[str, Any] = {"parameterValues": self.parameters(task)}
        artifacts = {}
        for name, source in self.pipeline.task(task)["inputs"].get("artifacts", {}).items():
            producer, key = self._artifact_source(task, source)
            if producer not in self.outputs:
                raise KeyError(f"task {task} needs {producer}.{key}, and {producer} has not run")
            made = self.outputs[producer]["artifacts"][key]
            artifacts[name] = {
                "artifacts": [{"name": key, "type": made["type"], "uri": made["uri"], "metadata": made["metadata"]}]
            }
        if artifacts:
            inputs["artifacts"] = artifacts
        outputs: dict[str, Any] = {"outputFile": OUTPUT_FILE}
        defs = self.pipeline.component(task).get("outputDefinitions", {})
        if defs.get("artifacts"):
            outputs["artifacts"] = {
                name: {
                    "artifacts": [
                        {
                            "name": name,
                            "type": d["artifactType"],
                            "uri": f"{self.task_root(task)}/{name}",
                            "metadata": {},
                        }
                    ]
                }
                for name, d in defs["artifacts"].items()
            }
        if defs.get("parameters"):
            outputs["parameters"] = {name: {"outputFile": f"/tmp/kfp/outputs/{name}"} for name in defs["parameters"]}
        return {"inputs": inputs, "outputs": outputs}

    def task_root(self, task: str) -> str:
        return f"{self.pipeline_root.rstrip('/')}/{self.pipeline.name}/{self.run_id}/{task}"

    def record_uri(self, task: str) -> str:
        return f"{self.task_root(task)}/executor-output.json"

    def pod(
        self,
        task: str,
        *,
        namespace: str,
        service_account: str,
        images: dict[str, str],
        launcher_configmap: str,
        pod_security: dict | None = None,
    ) -> dict:
        """The task's pod: KFP's executor template + the driver's pod-spec patch; ``images`` maps the compiled
        image names to the ones loaded into the cluster (an unmapped one is used as compiled)."""
        container = self.pipeline.executor(task)
        executor_input = self.executor_input(task)
        params = executor_input["inputs"]["parameterValues"]
        platform = self.pipeline.platform.get(self.pipeline.component(task)["executorLabel"], {})
        name = f"{self.job_name}-{task}"[:63].rstrip("-")
        env = [
            {"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "KFP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        ]
        for secret in platform.get("secretAsEnv", []):
            for pair in secret["keyToEnv"]:
                ref = {
                    "key": pair["secretKey"],
                    "name": secret["secretName"],
                    "optional": secret.get("optional", False),
                }
                env.append({"name": pair["envVar"], "valueFrom": {"secretKeyRef": ref}})
        mounts = [{"mountPath": LAUNCHER_DIR, "name": "kfp-launcher"}]
        mounts += [{"mountPath": path, "name": vol} for vol, path in SCRATCH.items()]
        volumes = [{"name": "kfp-launcher", "configMap": {"name": launcher_configmap}}]
        volumes += [{"name": vol, "emptyDir": {}} for vol in SCRATCH]
        for mount in platform.get("emptyDirMounts", []):
            empty = {k: mount[k] for k in ("medium", "sizeLimit") if mount.get(k)}
            volumes.append({"name": mount["volumeName"], "emptyDir": empty})
            mounts.append({"mountPath": mount["mountPath"], "name": mount["volumeName"]})
        limits = {}
        resources = container.get("resources", {})
        for key, field_name in (("cpu", "resourceCpuLimit"), ("memory", "resourceMemoryLimit")):
            if resources.get(field_name):
                limits[key] = self._placeholders(resources[field_name], task, params)
        accelerator = resources.get("accelerator")
        if accelerator:
            count = self._placeholders(str(accelerator.get("resourceCount") or accelerator.get("count")), task, params)
            limits[accelerator.get("resourceType") or accelerator["type"]] = count
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "serviceAccountName": service_account,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, **(pod_security or {})},
            "containers": [
                {
                    "name": "main",
                    "image": images.get(container["image"], container["image"]),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", f"{LAUNCHER_DIR}/kfp_launch.py"],
                    "args": [
                        "--executor_input",
                        json.dumps(executor_input),
                        "--record_uri",
                        self.record_uri(task),
                        "--",
                        *container["command"],
                        *container["args"],
                    ],
                    "env": env,
                    "resources": {"limits": limits} if limits else {},
                    "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        if platform.get("activeDeadlineSeconds"):
            spec["activeDeadlineSeconds"] = int(platform["activeDeadlineSeconds"])
        selector = platform.get("nodeSelector", {}).get("nodeSelectorJson", {}).get("componentInputParameter")
        if selector and self._channel(selector):
            spec["nodeSelector"] = self._channel(selector)
        tolerations = []
        for toleration in platform.get("tolerations", []):
            source = toleration.get("tolerationJson", {}).get("componentInputParameter")
            tolerations += list(self._channel(source) or []) if source else [toleration]
        if tolerations:
            spec["tolerations"] = tolerations
        labels = {"pipeline/runid": self.run_id, "pipelines.kubeflow.org/v2_component": "true"}
        labels.update(platform.get("podMetadata", {}).get("labels", {}))
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "annotations": {"pipelines.kubeflow.org/v2_component": "true"},
            },
            "spec": spec,
        }
