"""The JobSet v0.12.0 controller of ``../shared/tools/cluster`` (``jobset-controller.xz``) beside a running cluster.

The folder's ``cluster`` script does not start it (its README, "JobSet controller"), so this module does what that
README describes: the binary unpacked under the cluster's WORKDIR, its ``--config`` made from
``jobset-config.example.yaml`` with ``WORKDIR`` replaced (internal certificate management off, webhook server on
127.0.0.1:19444 serving ``WORKDIR/jobset/certs/tls.{crt,key}``), a self-signed CA and serving pair made with
openssl, and JobSet's four admission webhooks (its ``config/components/webhook`` manifests: mutating and
validating, for JobSets and for pods carrying ``jobset.sigs.k8s.io/jobset-name``) registered with
``clientConfig.url`` and that CA, as ``cluster trainer-up`` registers the Trainer's.

It runs *inside* the cluster's network namespace (``nsenter -n`` into the namespace holder), as the Trainer does:
the kube-apiserver lives there, and a webhook URL on 127.0.0.1 is the apiserver's own loopback. Started in its
own process group and stopped by that group's id before ``cluster down``.
"""

from __future__ import annotations

import base64
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.kube import CLUSTER_DIR, Cluster, stop_process_group

BINARY = CLUSTER_DIR / "jobset-controller.xz"
CONFIG_EXAMPLE = CLUSTER_DIR / "jobset-config.example.yaml"
WEBHOOK = "https://127.0.0.1:19444"
# JobSet v0.12.0's webhooks (config/components/webhook: manifests.yaml and the two patches): name, path, rule.
WEBHOOKS = {
    "MutatingWebhookConfiguration": [
        ("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        ("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods"),
    ],
    "ValidatingWebhookConfiguration": [
        ("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        ("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods"),
    ],
}


def available() -> bool:
    return BINARY.is_file() and CONFIG_EXAMPLE.is_file()


@dataclass
class JobSetController:
    cluster: Cluster
    process: subprocess.Popen | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.cluster.workdir / "jobset"

    @property
    def log(self) -> Path:
        return self.cluster.workdir / "logs" / "jobset.log"

    def start(self, timeout_s: float = 120) -> JobSetController:
        start = time.monotonic()
        binary = self.cluster.workdir / "bin" / "jobset-controller"
        if not binary.is_file():
            tmp = binary.with_suffix(".tmp")
            with tmp.open("wb") as out:
                subprocess.run(["xz", "-dc", str(BINARY)], stdout=out, check=True)
            tmp.chmod(0o755)
            tmp.rename(binary)
        certs = self.home / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        _self_signed(certs)
        config = self.home / "config.yaml"
        config.write_text(CONFIG_EXAMPLE.read_text().replace("WORKDIR", str(self.cluster.workdir)))
        health = yaml.safe_load(config.read_text())["health"]["healthProbeBindAddress"]
        nspid = (self.cluster.workdir / "run" / "ns.pid").read_text().strip()
        argv = ["nsenter", "-t", nspid, "-n", "--", str(binary), "--config", str(config)]
        argv += ["--kubeconfig", str(self.cluster.kubeconfig), "--zap-devel=false"]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(nspid, health, timeout_s)
        self._register(certs / "ca.crt")
        self.timings["jobset-controller up"] = time.monotonic() - start
        return self

    def _wait_ready(self, nspid: str, health: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jobset-controller exited {self.process.returncode}; {self.log}:\n{self.tail()}")
            probe = subprocess.run(
                ["nsenter", "-t", nspid, "-n", "--", "curl", "-sf", f"http://{health}/readyz"], capture_output=True
            )
            if probe.returncode == 0:
                return
            time.sleep(1)
        raise TimeoutError(f"jobset-controller not ready after {timeout_s:.0f} s; {self.log}:\n{self.tail()}")

    def _register(self, ca: Path) -> None:
        bundle = base64.b64encode(ca.read_bytes()).decode()
        docs = []
        for kind, hooks in WEBHOOKS.items():
            webhooks = []
            for name, path, group, version, resource in hooks:
                hook = {
                    "name": name,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {"url": WEBHOOK + path, "caBundle": bundle},
                    "rules": [
                        {
                            "apiGroups": [group],
                            "apiVersions": [version],
                            "operations": ["CREATE", "UPDATE"] if resource == "jobsets" else ["CREATE"],
                            "resources": [resource],
                        }
                    ],
                }
                if resource == "pods":
                    hook["objectSelector"] = {
                        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
                    }
                webhooks.append(hook)
            docs.append(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": f"jobset-{kind.split('Webhook')[0].lower()}"},
                    "webhooks": webhooks,
                }
            )
        self.cluster.apply(yaml.safe_dump_all(docs))

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        stop_process_group(self.process)


def _self_signed(certs: Path) -> None:
    """A CA and a serving pair for 127.0.0.1 (what the webhook server reads from its certDir)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=jobset-webhook-ca",
            "-keyout", str(certs / "ca.key"), "-out", str(certs / "ca.crt"))  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.csr"))  # fmt: skip
    (certs / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(certs / "tls.csr"), "-CA", str(certs / "ca.crt"), "-CAkey",
            str(certs / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(certs / "ext.cnf"),
            "-out", str(certs / "tls.crt"))  # fmt: skip
