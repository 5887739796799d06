"""The chart's RBAC grants exactly what the pipeline's pods call on the Kubernetes API.

The calls are the Kubeflow SDK's (``kubeflow`` 0.5.0, TrainerClient) as measured against a fake API
server (the ``kubeflow-trainer-public`` ConfigMap in ``kubeflow-system``, ``trainingruntimes`` then
``clustertrainingruntimes``, ``trainjobs`` create/get, pods by JobSet name), and the calls the TrainJob launcher's tests
record in ``tests/fixtures/trainjob_api_calls*.json`` (tests/launch/test_trainjob.py; with the delete of a task stopped
by SIGTERM). Both directions:
every call is allowed (nothing fails with 403 on a cluster), and every granted verb is used by some
call (least privilege).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from tests.chart.chart_render import NAMESPACE, REPO, render

# The launcher test's records: a task that waits for its job to complete, and one stopped by SIGTERM meanwhile.
RECORDED_CALLS = tuple(
    REPO / "tests" / "fixtures" / name for name in ("trainjob_api_calls.json", "trainjob_api_calls_terminated.json")
)
RUNTIME = "g2rpo-torch-distributed"

# What TrainerClient does for train() / wait_for_job_status() / get_job_logs(), measured against a fake API server.
SDK_CALLS = [
    ("GET", "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public"),
    ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainingruntimes/{RUNTIME}"),
    ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{RUNTIME}"),
    ("POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs"),
    ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/g2rpo-abc12"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dg2rpo-abc12"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/g2rpo-abc12-node-0-0-xyz/log?container=node"),
    # The launcher's own call (the SDK has none): SIGTERM while the task waits deletes its job.
    ("DELETE", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/g2rpo-abc12"),
]


@dataclass(frozen=True)
class Request:
    """One API call as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with subresource: pods/log
    namespace: str | None
    name: str | None


def to_request(method: str, url: str) -> Request:
    """An HTTP call to the Kubernetes API as the RBAC request it is authorised as."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    elif parts[0] == "apis":  # /apis/group/version/...
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a Kubernetes API path: {url}")
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method.upper())
    if verb is None:
        verb = "get" if name else "list"
        if "watch=true" in urlsplit(url).query:
            verb = "watch"
    return Request(verb, group, f"{resource}/{sub}" if sub else resource, namespace, name)


def grants(docs: list[dict], service_account: str) -> list[tuple[str | None, dict]]:
    """(namespace or None for cluster-wide, rule) for every rule bound to the service account."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = binding["subjects"]
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account for s in subjects):
            continue
        assert all(s["namespace"] == NAMESPACE for s in subjects), "bound to this release's service account only"
        where = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        out.extend((where, rule) for rule in role["rules"])
    return out


def allowed_by(request: Request, namespace: str | None, rule: dict) -> bool:
    if namespace is not None and request.namespace != namespace:
        return False
    return (
        request.group in rule["apiGroups"]
        and request.resource in rule["resources"]
        and request.verb in rule["verbs"]
        # A recorded call without a name (the launcher's records) is checked on the rest.
        and ("resourceNames" not in rule or request.name is None or request.name in rule["resourceNames"])
    )


def recorded_calls() -> list[Request]:
    """The launcher test's records: apiGroup, resource, subresource, verb and namespace ("<job
    namespace>" for the TrainJob's, "cluster" for cluster-scoped); names are not recorded."""
    out = []
    for call in (c for path in RECORDED_CALLS for c in json.loads(path.read_text())):
        resource = f"{call['resource']}/{call['subresource']}" if call["subresource"] else call["resource"]
        namespace = {"<job namespace>": NAMESPACE, "cluster": None}.get(call["namespace"], call["namespace"])
        out.append(Request(call["verb"], call["apiGroup"], resource, namespace, None))
    return out


# What KFP 2.17's driver and launcher and Argo v4.0.5's executor called as a run's service account in the cluster
# tier (docs/cluster.md), each refused until granted: the root DAG driver's ConfigMap, the executor's task result
# (create; Argo documents patch too), the launcher's S3 Secret (the chart's, named in kfp-launcher) and its own pod.
KFP_CALLS = [
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/kfp-launcher"),
    ("POST", f"/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/workflowtaskresults"),
    ("PATCH", f"/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/workflowtaskresults/g2rpo-alignment-x-123"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/g2rpo-s3"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/g2rpo-alignment-x-system-container-impl-123"),
]


@pytest.fixture(scope="module")
def rules():
    """The TrainJob launcher's rules: the chart without the KFP runner Role (its own tests are below)."""
    return grants(render({"kfp": {"runnerRbac": False}}), service_account="g2rpo")


@pytest.fixture(scope="module")
def kfp_rules():
    """The runner Role's rules alone: what the default install adds to the launcher's."""
    launcher = grants(render({"kfp": {"runnerRbac": False}}), service_account="g2rpo")
    return [grant for grant in grants(render({}), service_account="g2rpo") if grant not in launcher]


def _check_exact(requests: list[Request], rules):
    for request in requests:
        assert any(allowed_by(request, ns, rule) for ns, rule in rules), f"not allowed: {request}"
    for ns, rule in rules:
        for verb in rule["verbs"]:
            for resource in rule["resources"]:
                used = any(r.verb == verb and r.resource == resource and allowed_by(r, ns, rule) for r in requests)
                assert used, f"granted but never called: {verb} {resource} in {ns or 'the cluster'}"


def test_rules_are_exactly_the_sdk_calls(rules):
    _check_exact([to_request(method, url) for method, url in SDK_CALLS], rules)


def test_no_wildcards_and_no_secrets(rules):
    for _, rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "secrets" not in rule["resources"], "S3 keys reach pods through secretKeyRef, not the API"


def test_the_trainer_config_grant_is_one_named_configmap(rules):
    [(namespace, rule)] = [(ns, r) for ns, r in rules if "configmaps" in r["resources"]]
    assert namespace == "kubeflow-system" and rule["resourceNames"] == ["kubeflow-trainer-public"]


def test_unrelated_calls_are_denied(rules):
    for method, url in [
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/g2rpo-s3"),
        ("DELETE", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/other/trainjobs/x"),
        ("PATCH", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/x"),
        ("GET", "/api/v1/namespaces/kubeflow-system/configmaps/other"),
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/other/trainjobs/x"),
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/pods"),
    ]:
        request = to_request(method, url)
        assert not any(allowed_by(request, ns, rule) for ns, rule in rules), request


def test_rules_are_exactly_the_launchers_recorded_calls(rules):
    _check_exact(recorded_calls(), rules)


def test_the_kfp_runner_role_is_exactly_kfps_calls(kfp_rules):
    _check_exact([to_request(method, url) for method, url in KFP_CALLS], kfp_rules)


def test_the_kfp_runner_role_grants_one_secret_and_one_configmap_by_name(kfp_rules):
    named = {tuple(r["resources"]): r.get("resourceNames") for _, r in kfp_rules}
    assert named[("secrets",)] == ["g2rpo-s3"] and named[("configmaps",)] == ["kfp-launcher"], named
    for method, url in [
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/other"),
        ("LIST", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/other"),
        ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/x"),
        ("POST", f"/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/workflows"),
    ]:
        request = to_request(method, url)
        assert not any(allowed_by(request, ns, rule) for ns, rule in kfp_rules), request


def test_the_kfp_runner_role_follows_the_secret_name():
    launcher = grants(render({"kfp": {"runnerRbac": False}, "s3": {"existingSecret": "team-s3"}}), "g2rpo")
    added = [grant for grant in grants(render({"s3": {"existingSecret": "team-s3"}}), "g2rpo") if grant not in launcher]
    assert [rule["resourceNames"] for _, rule in added if rule["resources"] == ["secrets"]] == [["team-s3"]]
