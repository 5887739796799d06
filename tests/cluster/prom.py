"""Debian's Prometheus scraping the training pods as the chart's PodMonitor tells it to.

The cluster's pod network exists only inside its network namespace (``cluster``'s README: the host reaches the
namespace's veth address, not the pods). A Prometheus in a cluster runs on that network and scrapes pod IPs, so
this one does too: started with ``nsenter -n`` into the namespace holder, scraping pod IPs, listening on the
namespace's veth address, which the test on the host queries. (Scraping through the API server's pod proxy would work from the host as
well, but is not how a PodMonitor scrapes; it would hide a metrics port the pod network cannot reach.)

Debian's Prometheus (2.42) is built without Kubernetes service discovery (its config parser refuses
``kubernetes_sd_configs``), so discovery is done here, as the Prometheus Operator and that discovery would do it
for the chart's PodMonitor (rendered by Helm): a thread lists the namespace's pods from the API server every second
and writes a ``file_sd`` file with the pods the PodMonitor's ``selector`` keeps (``matchLabels``, and
``matchExpressions`` with ``Exists``), on the container port it names, labelled ``namespace``/``pod``/``container``
and by its ``relabelings`` (``keep`` node 0's pod; pod labels as ``trainjob`` and ``node_rank``). Scraped every second (the chart's 30 s would
miss most of a run this short). Started in its own process group; stopped by it.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.cluster.kube import Cluster, stop_process_group


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(podmonitor: dict, pods: list[dict]) -> list[dict]:
    """The file_sd entries the PodMonitor selects among ``pods`` (API JSON), with its relabelling applied."""
    spec = podmonitor["spec"]
    endpoint = spec["podMetricsEndpoints"][0]
    wanted = spec["selector"].get("matchLabels") or {}
    entries = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if pod["metadata"].get("namespace") != podmonitor["metadata"]["namespace"]:
            continue
        if any(labels.get(k) != v for k, v in wanted.items()):
            continue
        for expr in spec["selector"].get("matchExpressions") or []:
            if expr["operator"] != "Exists":
                raise NotImplementedError(f"matchExpressions operator {expr['operator']} (the chart uses Exists)")
        if any(expr["key"] not in labels for expr in spec["selector"].get("matchExpressions") or []):
            continue
        ip = pod.get("status", {}).get("podIP")
        if not ip or pod["status"].get("phase") != "Running":
            continue
        meta = {f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in labels.items()}
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") != endpoint["port"]:
                    continue
                out = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"],
                       "container": container["name"]}  # fmt: skip
                kept = True
                for rule in endpoint.get("relabelings") or []:
                    value = ";".join(meta.get(source, "") for source in rule["sourceLabels"])
                    if rule.get("action", "replace") == "keep":
                        kept = kept and re.fullmatch(rule.get("regex", "(.*)"), value) is not None
                    elif rule.get("action", "replace") == "replace" and value:
                        out[rule["targetLabel"]] = value
                    elif rule.get("action", "replace") != "replace":
                        raise NotImplementedError(f"relabel action {rule['action']} (the chart uses keep, replace)")
                if kept:
                    entries.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": out})
    return entries


@dataclass
class PodPrometheus:
    cluster: Cluster
    podmonitor: dict
    port: int = 19090
    interval: str = "1s"  # the chart's 30 s would miss most of a run this short
    workdir: Path | None = None
    process: subprocess.Popen | None = None
    config: dict = field(default_factory=dict)

    @property
    def host(self) -> str:
        server = yaml.safe_load(self.cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        return urllib.parse.urlparse(server).hostname  # the namespace's veth address

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60) -> PodPrometheus:
        self.workdir = self.workdir or self.cluster.workdir / "prometheus"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.targets_file = self.workdir / "targets.json"
        self.targets_file.write_text("[]")
        namespace, name = self.podmonitor["metadata"]["namespace"], self.podmonitor["metadata"]["name"]
        self.config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "scrape_configs": [
                {
                    "job_name": f"podMonitor/{namespace}/{name}/0",
                    "scrape_timeout": "1s",
                    "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
                }
            ],
        }
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config))
        api = k8s_config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self._core, self._stop = k8s.CoreV1Api(api), threading.Event()
        self._discovery = threading.Thread(target=self._discover, name="pod-discovery", daemon=True)
        self._discovery.start()
        nspid = (self.cluster.workdir / "run" / "ns.pid").read_text().strip()
        argv = ["nsenter", "-t", nspid, "-n", "--", "prometheus", f"--config.file={config_file}",
                f"--web.listen-address={self.host}:{self.port}", f"--storage.tsdb.path={self.workdir / 'tsdb'}"]  # fmt: skip
        with (self.workdir / "prometheus.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise TimeoutError(f"prometheus not ready at {self.url} after {timeout_s:.0f} s:\n{self.log_tail()}")

    def _discover(self) -> None:
        namespace = self.podmonitor["metadata"]["namespace"]
        while not self._stop.wait(1.0):
            try:
                pods = self._core.api_client.sanitize_for_serialization(self._core.list_namespaced_pod(namespace))
            except Exception:  # noqa: BLE001 - discovery retries next second, as Prometheus' own would
                continue
            tmp = self.targets_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pod_targets(self.podmonitor, pods["items"])))
            tmp.replace(self.targets_file)

    def log_tail(self, lines: int = 30) -> str:
        path = (self.workdir or Path("/nonexistent")) / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())["data"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{params.get('query', path)!r}: {json.loads(exc.read()).get('error')}") from None

    def query_range(self, expr: str, seconds: float = 900, step: float = 1) -> list[dict[str, Any]]:
        end = time.time()
        return self.api("query_range", query=expr, start=end - seconds, end=end, step=step)["result"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def stop(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
            self._discovery.join(timeout=10)
        stop_process_group(self.process)
