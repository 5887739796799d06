"""The Helm chart renders, lints strictly and validates offline over several values sets.

Core kinds go through kubernetes-validate --strict; every custom resource through its CRD's
schema from ``../shared/crds/`` (closed against unknown fields); every pod template meets the
restricted Pod Security Standard except the one documented exception (RDMA's IPC_LOCK).
"""

from __future__ import annotations

import json
import re

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

import g2rpo
from g2rpo.errors import USAGE_EXIT_STATUS
from g2rpo.launch.trainjob import NODE_JOB, TRAINING_RUNTIME, USAGE_FAILURE_RULE, Placement
from g2rpo.steps.placement import load_profile
from tests.chart.chart_render import (
    CHART,
    CRD_DIR,
    DASHBOARD_FILE,
    EVERYTHING_OFF,
    KUBE_VERSION,
    NAMESPACE,
    RULES_FILE,
    VALUE_SETS,
    chart_with_monitoring_files,
    closed,
    is_custom,
    kinds,
    load_crd_schemas,
    pod_specs,
    render,
)
from tests.shared_checkout import require_shared

CUSTOM_KINDS = {"ClusterTrainingRuntime", "PodMonitor", "ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def chart_copy(tmp_path_factory):
    return chart_with_monitoring_files(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module")
def rendered(chart_copy):
    return {name: render(values, chart=chart_copy) for name, values in VALUE_SETS.items()}


@pytest.fixture(scope="module")
def crd_schemas():
    require_shared("crds")  # the CRD schemas are read from ../shared/crds (CI has it)
    assert CRD_DIR.is_dir(), CRD_DIR
    return load_crd_schemas()


@pytest.mark.parametrize("values_set", sorted(VALUE_SETS))
def test_chart_lints_strictly(values_set, chart_copy):
    report = helm_python.lint(chart_copy, VALUE_SETS[values_set], strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values_set", sorted(VALUE_SETS))
def test_core_kinds_validate_strictly(values_set, rendered):
    core = [doc for doc in rendered[values_set] if not is_custom(doc)]
    assert core, "every values set renders some core objects"
    for doc in core:
        # Raises ValidationError on a schema violation or an unexpected field (strict).
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("values_set", sorted(VALUE_SETS))
def test_custom_resources_match_their_crds(values_set, rendered, crd_schemas):
    for doc in (doc for doc in rendered[values_set] if is_custom(doc)):
        schema = crd_schemas.get((doc["apiVersion"], doc["kind"]))
        assert schema is not None, f"no CRD in {CRD_DIR} for {doc['apiVersion']} {doc['kind']}"
        # OpenAPI v3 schemas as JSON Schema draft 7; the CRDs' x-kubernetes-* keywords are ignored.
        jsonschema.Draft7Validator(closed(schema)).validate(doc)


def test_everything_on_renders_every_custom_resource(rendered):
    assert CUSTOM_KINDS <= set(kinds(rendered["everything_on"]))


def test_custom_resources_are_gated_by_their_flags(rendered, chart_copy):
    assert not any(is_custom(doc) for doc in rendered["everything_off"])
    assert kinds(rendered["everything_off"]) == ["ConfigMap"]  # the placement profile alone
    flags = {
        "ClusterTrainingRuntime": {"trainingRuntime": {"enabled": True}},
        "PodMonitor": {"monitoring": {"podMonitor": {"enabled": True}}},
        "ServiceMonitor": {"monitoring": {"pushgateway": {"serviceMonitor": {"enabled": True}}}},
        "PrometheusRule": {"monitoring": {"prometheusRule": {"enabled": True}}},
    }
    for kind, flag in flags.items():
        values = {**EVERYTHING_OFF, **flag}
        if kind != "ClusterTrainingRuntime":
            values = {**values, "trainingRuntime": {"enabled": False}}
        assert [d["kind"] for d in render(values, chart=chart_copy) if is_custom(d)] == [kind]


def test_cluster_scoped_objects_carry_no_namespace(rendered):
    for doc in rendered["everything_on"]:
        if doc["kind"] in ("ClusterTrainingRuntime", "ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in doc["metadata"], doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] in (NAMESPACE, "kubeflow-system", "monitoring"), doc["metadata"]


def _sensitive(name: str) -> bool:
    return any(word in name.upper() for word in ("SECRET", "ACCESS_KEY", "PASSWORD", "TOKEN")) and not name.endswith(
        "_PATH"
    )


@pytest.mark.parametrize("values_set", sorted(VALUE_SETS))
def test_no_secret_value_is_rendered(values_set, rendered):
    docs = rendered[values_set]
    assert "Secret" not in kinds(docs)
    checked = 0
    for _, spec in (found for doc in docs for found in pod_specs(doc)):
        for container in spec["containers"]:
            for env in container.get("env", []):
                if _sensitive(env["name"]):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], env
                    checked += 1
    if any(True for doc in docs for _ in pod_specs(doc)):
        assert checked, "the S3 keys reach every pod, by reference"


@pytest.mark.parametrize("key", ["secretAccessKey", "accessKeyId", "password"])
def test_schema_has_no_place_for_key_material(key):
    with pytest.raises(helm_python.HelmError, match=key):
        render({"s3": {key: "AKIA-SENTINEL"}})


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"placement": {"gpuPerNode": 8}}, "gpuPerNode"),
        ({"placement": {"numNodes": 0}}, "numNodes"),
        ({"retraining": {"schedule": "every monday"}}, "schedule"),
        ({"s3": {"endpoint": "minio:9000"}}, "endpoint"),
        ({"trainingRuntime": {"name": "G2RPO_H200"}}, "name"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(values, field):
    with pytest.raises(helm_python.HelmError, match=field):
        render(values)


def _privileged_exceptions(values_set: str) -> set[str]:
    rdma = VALUE_SETS[values_set].get("trainingRuntime", {}).get("rdma", {}).get("enabled", False)
    return {"IPC_LOCK"} if rdma else set()


@pytest.mark.parametrize("values_set", sorted(VALUE_SETS))
def test_pod_templates_meet_the_restricted_standard(values_set, rendered):
    found = [(doc["kind"], path, spec) for doc in rendered[values_set] for path, spec in pod_specs(doc)]
    if values_set != "everything_off":
        assert found, "the values set renders pod templates"
    for kind, path, spec in found:
        where = f"{kind}{path}"
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True and pod.get("runAsUser", 0) != 0, where
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), where
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, where
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container.get("securityContext", {})
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("privileged", False) is False, where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            added = set(ctx.get("capabilities", {}).get("add", []))
            # Restricted allows adding NET_BIND_SERVICE only; IPC_LOCK is the documented RDMA exception.
            assert added <= {"NET_BIND_SERVICE"} | (
                _privileged_exceptions(values_set) if kind == "ClusterTrainingRuntime" else set()
            ), where
            assert ctx.get("seccompProfile", {}).get("type", "RuntimeDefault") == "RuntimeDefault", where


def _one(docs, kind):
    matches = [doc for doc in docs if doc["kind"] == kind]
    assert len(matches) == 1, kinds(docs)
    return matches[0]


def test_training_runtime_places_pods_on_the_h200_pool(rendered):
    runtime = _one(rendered["defaults"], "ClusterTrainingRuntime")
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    [(_, pod)] = list(pod_specs(runtime))
    [container] = pod["containers"]
    assert container["name"] == "node" and container["image"] == f"ghcr.io/g2rpo/g2rpo-trainer:{g2rpo.__version__}"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    [shm] = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_multi_node_values_reach_the_runtime_and_the_placement_profile(rendered):
    docs = rendered["multi_node"]
    runtime = _one(docs, "ClusterTrainingRuntime")
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 4
    [(_, pod)] = list(pod_specs(runtime))
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["rdma/hca_shared_devices_a"] == 1 and limits["nvidia.com/gpu"] == 8
    profile = _one(docs, "ConfigMap")["data"]
    # The launcher's own type reads the profile: a renamed field fails here, not on a cluster.
    placement = Placement(**yaml.safe_load(profile["placement.yaml"]))
    assert placement == Placement(
        gpus_per_node=8, node_selector=pod["nodeSelector"], tolerations=pod["tolerations"], shm_size="512Gi"
    )
    launch = yaml.safe_load(profile["launch.yaml"])
    assert launch["nodes"] == 4 and launch["runtime"] == runtime["metadata"]["name"]
    assert launch["image"] == pod["containers"][0]["image"]


# JobSet v0.12.0's webhook (pkg/webhooks/jobset_webhook.go): a failure rule's name, and the Job failure reasons
# it accepts; the Trainer's admission does not run it (../shared/tools/README.md), so it is checked here.
JOBSET_RULE_NAME = r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?"
JOB_FAILURE_REASONS = {
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
}


@pytest.mark.parametrize("values_set", [name for name in sorted(VALUE_SETS) if name != "everything_off"])
def test_the_runtime_fails_a_job_at_once_on_the_trainers_usage_status(values_set, rendered):
    # A bad model path exits 2 in every attempt: the Job fails on it at once (podFailurePolicy FailJob, reason
    # PodFailurePolicy) and the JobSet fails on that reason instead of using its restarts. Any other failure
    # (a lost pod, a crash, OOM) still fails the Job through backoffLimit 0 and restarts the JobSet.
    runtime = _one(rendered[values_set], "ClusterTrainingRuntime")
    jobset = runtime["spec"]["template"]["spec"]
    [node] = jobset["replicatedJobs"]
    job = node["template"]["spec"]
    assert (
        job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"
    )  # podFailurePolicy needs Never
    assert job["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": NODE_JOB, "operator": "In", "values": [USAGE_EXIT_STATUS]},
            }
        ]
    }
    assert NODE_JOB in [c["name"] for c in job["template"]["spec"]["containers"]]
    policy = jobset["failurePolicy"]
    assert isinstance(policy["maxRestarts"], int)  # the restarts the other failures keep
    assert policy["rules"] == [
        {
            "name": USAGE_FAILURE_RULE,
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "targetReplicatedJobs": [node["name"]],
        }
    ]
    for rule in policy["rules"]:  # what JobSet's webhook would refuse when the Trainer creates the JobSet
        assert re.fullmatch(JOBSET_RULE_NAME, rule["name"]) and len(rule["name"]) <= 128
        assert set(rule["onJobFailureReasons"]) <= JOB_FAILURE_REASONS


def test_the_runtime_is_the_one_the_launcher_names():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["trainingRuntime"]["name"] == TRAINING_RUNTIME
    assert NODE_JOB == "node"  # the runtime's replicated job and container (clustertrainingruntime.yaml)


def test_retraining_cronjob_submits_with_the_release_service_account(rendered):
    cron = _one(rendered["everything_on"], "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["timeZone"] == "Etc/UTC"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == f"ghcr.io/g2rpo/g2rpo:{g2rpo.__version__}"
    assert container["command"] == ["g2rpo", "pipeline", "submit"]
    args = container["args"]
    assert args[args.index("--host") + 1] == "http://ml-pipeline.kubeflow.svc:8888"
    assert args[args.index("--service-account") + 1] == pod["serviceAccountName"] == "g2rpo"
    assert args[-2:] == ["--experiment", "g2rpo"]
    [token] = pod["volumes"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"


def test_the_placement_profiles_service_account_is_the_charts(rendered):
    # `g2rpo pipeline submit` runs every pod (and a TrainJob's) as the profile's account: the one the chart
    # creates and grants the launcher's calls, not a name that does not exist, nor KFP's pipeline-runner.
    account = _one(rendered["defaults"], "ServiceAccount")
    assert account["metadata"]["name"] == load_profile().service_account


def test_monitors_select_the_training_pods_and_the_pushgateway(rendered):
    docs = rendered["everything_on"]
    runtime = _one(docs, "ClusterTrainingRuntime")
    [(_, pod)] = list(pod_specs(runtime))
    pod_labels = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"][
        "labels"
    ]
    monitor = _one(docs, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchExpressions"][0]["key"] == "jobset.sigs.k8s.io/jobset-name"
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in pod["containers"][0]["ports"]}
    # Only node 0's pod (rank 0 serves /metrics; the cluster tier saw the other pods' targets down).
    (keep,) = [r for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"] if r.get("action") == "keep"]
    assert keep["sourceLabels"] == ["__meta_kubernetes_pod_label_batch_kubernetes_io_job_completion_index"]
    assert keep["regex"] == "0"
    service_monitor = _one(docs, "ServiceMonitor")
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert service_monitor["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-trainer"))
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def test_rule_and_dashboard_wrap_the_chart_files(rendered, chart_copy):
    docs = rendered["everything_on"]
    rules = yaml.safe_load((chart_copy / RULES_FILE).read_text())
    assert _one(docs, "PrometheusRule")["spec"]["groups"] == rules["groups"]
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert json.loads(dashboard["data"]["g2rpo.json"]) == json.loads((chart_copy / DASHBOARD_FILE).read_text())


@pytest.mark.parametrize(("flag", "missing"), [("prometheusRule", RULES_FILE), ("dashboard", DASHBOARD_FILE)])
def test_enabled_monitoring_file_that_is_missing_fails_naming_it(flag, missing, tmp_path):
    chart = chart_with_monitoring_files(tmp_path)
    (chart / missing).unlink()
    with pytest.raises(helm_python.HelmError, match=missing.replace(".", r"\.")):
        render({"monitoring": {flag: {"enabled": True}}}, chart=chart)


def test_image_names_and_chart_version_follow_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == g2rpo.__version__
    assert values["images"]["trainer"]["repository"] == "ghcr.io/g2rpo/g2rpo-trainer"
    assert values["images"]["component"]["repository"] == "ghcr.io/g2rpo/g2rpo"
    assert values["images"]["trainer"]["tag"] == values["images"]["component"]["tag"] == ""  # = appVersion
