"""A loopback Kubernetes API server that speaks the paths the Kubeflow Trainer SDK calls.

Standard library only (``http.server``). It serves the Trainer's public ConfigMap, one
ClusterTrainingRuntime (no namespaced TrainingRuntime: 404, as on a cluster with only the Helm
chart's runtime), TrainJobs (create, get; 409 on a second create), the JobSet's pods and node-0's
log. A TrainJob's status follows a script: ``KubeAPI.script(job, polls)`` returns the ``status`` the
``polls``-th GET sees. Every request is recorded (method, path, query) for the tests and for the
RBAC fixture (:func:`rbac_calls`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GROUP_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
CREATED = "2026-11-30T12:00:00Z"


def torch_runtime(name: str, image: str = "ghcr.io/g2rpo/g2rpo:test", s3_secret: str = "g2rpo-s3") -> dict[str, Any]:
    """A ClusterTrainingRuntime of the shape the Helm chart ships: torch, one replicated job "node" whose
    container reads the S3 credentials from ``s3_secret`` (tests/launch/test_trainer_check.py serves the
    chart's own rendered runtime instead)."""
    s3_env = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": s3_secret, "key": key}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {
                                                    "name": "node",
                                                    "image": image,
                                                    # the chart's trainingRuntime.sharedVolume: output.dir of
                                                    # multi-node runs
                                                    "env": [
                                                        *s3_env,
                                                        {"name": "G2RPO_RUNS_DIR", "value": "/g2rpo-runs"},
                                                    ],
                                                    "volumeMounts": [{"name": "runs", "mountPath": "/g2rpo-runs"}],
                                                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                                                }
                                            ]
                                        }
                                    }
                                },
                            },
                        }
                    ]
                }
            },
        },
    }


def condition(kind: str, message: str, reason: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason or kind,
        "message": message,
        "lastTransitionTime": CREATED,
    }


@dataclass
class KubeAPI:
    runtime_name: str
    runtime: dict[str, Any] | None = None  # the ClusterTrainingRuntime served (default: torch_runtime(runtime_name))
    script: Callable[[dict[str, Any], int], dict[str, Any] | None] = lambda job, polls: None
    log_lines: list[str] = field(default_factory=lambda: ["rank 0: iteration 0", "rank 0: done"])
    calls: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> KubeAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _handle(self) -> None:
                url = urlsplit(self.path)
                body = self._body()
                with api.lock:
                    api.calls.append(
                        {"method": self.command, "path": url.path, "query": parse_qs(url.query), "body": body}
                    )
                    status, payload = api.route(self.command, url.path, parse_qs(url.query), body)
                if isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain"
                else:
                    data, ctype = json.dumps(payload).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def configuration(self) -> Any:
        from kubernetes import client

        config = client.Configuration()
        config.host = self.host
        return config

    # ------------------------------------------------------------------ routes

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public":
            return 200, {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubeflow-trainer-public", "namespace": "kubeflow-system"},
                "data": {"kubeflow_trainer_version": "v2.3.0"},
            }
        if method == "GET" and re.fullmatch(rf"{GROUP_PATH}/namespaces/[^/]+/trainingruntimes/[^/]+", path):
            return _not_found("trainingruntimes", path.rsplit("/", 1)[1])
        if method == "GET" and (m := re.fullmatch(rf"{GROUP_PATH}/clustertrainingruntimes/([^/]+)", path)):
            if m.group(1) == self.runtime_name:
                return 200, self.runtime or torch_runtime(self.runtime_name)
            return _not_found("clustertrainingruntimes", m.group(1))
        if m := re.fullmatch(rf"{GROUP_PATH}/namespaces/([^/]+)/trainjobs(?:/([^/]+))?", path):
            return self._trainjobs(method, m.group(1), m.group(2), body)
        if method == "GET" and (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path)):
            return 200, self._pods(m.group(1), query.get("labelSelector", [""])[0])
        if method == "GET" and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log", path):
            return 200, "".join(line + "\n" for line in self.log_lines)
        return _not_found("path", path)

    def _trainjobs(self, method: str, namespace: str, name: str | None, body: Any) -> tuple[int, Any]:
        if method == "POST" and name is None:
            name = body["metadata"]["name"]
            if name in self.jobs:
                return 409, _status(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{name}" already exists')
            job = json.loads(json.dumps(body))
            job["metadata"].update(namespace=namespace, creationTimestamp=CREATED, uid=f"uid-{name}")
            self.jobs[name] = job
            return 201, job
        if method == "GET" and name is not None:
            if name not in self.jobs:
                return _not_found("trainjobs", name)
            job = self.jobs[name]
            self.polls[name] = self.polls.get(name, 0) + 1
            status = self.script(job, self.polls[name])
            if status is not None:
                job["status"] = status
            return 200, job
        if method == "DELETE" and name is not None:
            if self.jobs.pop(name, None) is None:
                return _not_found("trainjobs", name)
            return 200, _status(200, "", f'trainjobs.trainer.kubeflow.org "{name}" deleted') | {"status": "Success"}
        return 405, _status(405, "MethodNotAllowed", f"{method} on trainjobs")

    def _pods(self, namespace: str, selector: str) -> dict[str, Any]:
        m = re.match(r"jobset\.sigs\.k8s\.io/jobset-name=([^,]+)", selector)
        job = self.jobs.get(m.group(1)) if m else None
        items = []
        if job is not None:
            name = job["metadata"]["name"]
            items.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-node-0-0-abcde",
                        "namespace": namespace,
                        "creationTimestamp": CREATED,
                        "labels": {
                            "jobset.sigs.k8s.io/jobset-name": name,
                            "jobset.sigs.k8s.io/replicatedjob-name": "node",
                            "batch.kubernetes.io/job-completion-index": "0",
                        },
                    },
                    "spec": {"containers": [{"name": "node", "image": "ghcr.io/g2rpo/g2rpo:test"}]},
                    "status": {"phase": "Running"},
                }
            )
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _not_found(kind: str, name: str) -> tuple[int, Any]:
    return 404, _status(404, "NotFound", f'{kind} "{name}" not found')


_PATH_RULES = [
    (r"/api/v1/namespaces/([^/]+)/configmaps/[^/]+", "", "configmaps", ""),
    (rf"{GROUP_PATH}/namespaces/([^/]+)/trainingruntimes/[^/]+", "trainer.kubeflow.org", "trainingruntimes", ""),
    (rf"{GROUP_PATH}/clustertrainingruntimes/[^/]+", "trainer.kubeflow.org", "clustertrainingruntimes", ""),
    (rf"{GROUP_PATH}/namespaces/([^/]+)/trainjobs(?:/[^/]+)?", "trainer.kubeflow.org", "trainjobs", ""),
    (r"/api/v1/namespaces/([^/]+)/pods", "", "pods", ""),
    (r"/api/v1/namespaces/([^/]+)/pods/[^/]+/log", "", "pods", "log"),
]


def rbac_calls(calls: list[dict[str, Any]], job_namespace: str) -> list[dict[str, str]]:
    """The recorded calls as RBAC terms (apiGroup, resource, subresource, verb, scope), unique and
    sorted: what a Role (namespaced) and ClusterRole (cluster-scoped reads) must grant. The job's
    namespace is written as ``<job namespace>``."""
    out = set()
    for call in calls:
        for pattern, group, resource, sub in _PATH_RULES:
            m = re.fullmatch(pattern, call["path"])
            if not m:
                continue
            named = not call["path"].endswith(("/pods", "/trainjobs"))
            verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(
                call["method"], "get" if named else "list"
            )
            if verb == "get" and call["query"].get("watch") == ["true"]:
                verb = "watch"
            namespace = m.group(1) if m.groups() else None
            scope = "cluster" if namespace is None else ("<job namespace>" if namespace == job_namespace else namespace)
            out.add((group, resource, sub, verb, scope))
            break
        else:
            raise AssertionError(f"unmapped call {call['method']} {call['path']}")
    return [dict(zip(("apiGroup", "resource", "subresource", "verb", "namespace"), row)) for row in sorted(out)]
