"""Kubeflow Pipelines' own backend on the tier's cluster: the KFP API server, Argo, KFP's driver and launcher,
ML Metadata, the persistence agent.

``../shared/tools/kfp`` (its README) brings up what it can: ``kfp images`` builds and loads the system images under
the names KFP 2.17.0 compiles (driver, launcher, argoexec), ``kfp up`` starts ML Metadata and a SeaweedFS S3 on the
host at ``cluster ip``, the Argo CRDs, namespace ``kubeflow`` with KFP's ``pipeline-runner`` RBAC, and the Argo
workflow-controller (behind its watch proxy). The tool does not run the API server, a database for it, or the
persistence agent; this module adds them (the extension the tool's README leaves open):

- **MariaDB** (Debian's ``mariadb-server``): a private instance, data under ``WORKDIR/kfp/mariadb``, on loopback;
  the API server's database ``mlpipeline``.
- **The KFP 2.17.0 API server** (``apiserver.xz`` from the tool folder) on the host: HTTP on ``cluster ip:8888``,
  gRPC on ``:8887`` (its HTTP gateway dials the gRPC port on localhost, so that flag takes no address). It
  compiles each run into the Argo Workflow itself, with the driver/launcher images of the tool and, through its
  ``COMPILED_PIPELINE_SPEC_PATCH``, ``hostAliases`` for the names it passes to the pods (ML Metadata, itself):
  the cluster has no DNS. It reaches Kubernetes with the cluster's admin kubeconfig.
- **The persistence agent** in a pod (its Argo informer takes in-cluster config only), from an image built here
  (``tests/cluster/kfp/persistence-agent.Dockerfile``), with the projected token KFP mounts for it, reporting
  every Workflow of ``kubeflow`` to the API server: what turns a Workflow into the run a user sees.

Run by hand (as root, on a cluster that is up)::

    python -m tests.cluster.kfp_backend up WORKDIR      # images, kfp up, MariaDB, API server, persistence agent
    python -m tests.cluster.kfp_backend down WORKDIR    # everything started here, then `kfp down`
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.kube import Cluster
from tests.shared_checkout import shared_path

KFP_DIR = shared_path("tools/kfp")
KFP = KFP_DIR / "kfp"
HERE = Path(__file__).resolve().parent / "kfp"
NAMESPACE = "kubeflow"  # KFP's own namespace: a single-user KFP runs every pipeline here
# Argo's pod-status finalizer, as docs/deployment.md asks of a cluster that runs this pipeline: without it a train pod
# deleted mid-run (a node drained, a spot node reclaimed) is often gone before the controller reads its exit, the
# node is marked ``Error: pod deleted``, and the retry policy KFP compiles from ``set_retry`` (Argo's default,
# ``OnFailure``) does not retry an Error: the run fails. Measured on this tier: one deletion of two retried.
CONTROLLER_ENV = {"ARGO_POD_STATUS_CAPTURE_FINALIZER": "true"}
DRIVER_IMAGE = "ghcr.io/kubeflow/kfp-driver:2.17.0"
LAUNCHER_IMAGE = "ghcr.io/kubeflow/kfp-launcher:2.17.0"
AGENT_IMAGE = "localhost/kfp-persistence-agent:2.17.0"
SWF_IMAGE = "localhost/kfp-scheduledworkflow:2.17.0"
BASE_IMAGE = "localhost/debian-py311:bookworm"
API_HTTP_PORT = 8888
API_GRPC_PORT = 8887
DB_PORT = 23306
# The names KFP's compiler hands the pods for ML Metadata and the API server (no cluster DNS here).
SERVICE_NAMES = [
    "metadata-grpc-service.kubeflow.svc.cluster.local",
    "ml-pipeline.kubeflow.svc.cluster.local",
    "metadata-grpc-service",
    "ml-pipeline",
]


def _wait(what: str, ready, timeout_s: float, log: Path | None = None, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        if ready():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    state = f"exited {process.returncode}" if process is not None and process.poll() is not None else "timed out"
    raise RuntimeError(f"{what} {state} after {timeout_s:.0f} s; {log}:\n{tail}")


@dataclass
class KfpBackend:
    """The backend on one cluster (``cluster.workdir`` is the tool's WORKDIR)."""

    cluster: Cluster
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.cluster.workdir / "kfp"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def host(self) -> str:
        """The API server's URL, as ``g2rpo pipeline submit --host`` and ``kfp.Client(host=...)`` take it."""
        return f"http://{self.cluster.ip()}:{API_HTTP_PORT}"

    def _kfp(self, *args: str, timeout: float = 900, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [str(KFP), *args], capture_output=True, text=True, timeout=timeout, cwd=self.cluster.workdir,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"kfp {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}{done.stdout[-2000:]}"
            )
        return done.stdout + done.stderr

    def _timed(self, name: str, step, *args):
        start = time.monotonic()
        out = step(*args)
        self.timings[name] = time.monotonic() - start
        return out

    def up(self) -> KfpBackend:
        """Images, ``kfp up``, MariaDB, the API server, the persistence agent; raises naming the failing part."""
        return self.system().server()

    def system(self) -> KfpBackend:
        """The tool's part: the system images, then ``kfp up`` (ML Metadata, SeaweedFS S3, Argo, namespace, RBAC)."""
        workdir = str(self.cluster.workdir)
        self._timed("kfp images", self._kfp, "images", workdir)
        # The workflow-controller inherits this from ``kfp up``: see :data:`CONTROLLER_ENV`.
        self._timed("kfp up", lambda: self._kfp("up", workdir, env=CONTROLLER_ENV))
        self._timed("upgrade front", self.front_upgrades)
        return self

    def front_upgrades(self) -> None:
        """Put ``kfp/upgrade_front.py`` on the tool's proxy port and the tool's ``rv-proxy`` behind it, on the next
        port: the controller's ``pods/exec`` (how Argo stops a terminated run's containers) reaches the API server,
        which ``rv-proxy`` alone refuses ("Upgrade request required"; a defect of the tool, said in
        docs/cluster.md). ``kfp down`` stops the moved ``rv-proxy`` by its pid file; :meth:`down` stops the front."""
        run = self.root / "run"
        env = dict(line.split("=", 1) for line in (run / "env").read_text().splitlines() if "=" in line)
        ns = (self.cluster.workdir / "run" / "ns.pid").read_text().strip()
        pki = self.cluster.workdir / "pki"
        port = int(os.environ.get("KFP_PROXY_PORT", "18001"))
        credentials = [env["APISERVER"], str(pki / "ca.crt"), str(pki / "admin.token")]
        tool_proxy = run / "rv-proxy.pid"
        old = int(tool_proxy.read_text())
        os.kill(old, signal.SIGTERM)

        def gone() -> bool:
            try:
                os.kill(old, 0)
            except ProcessLookupError:
                return True
            return False

        _wait(f"the tool's rv-proxy (pid {old}) to stop", gone, 15)
        in_netns = ["setsid", "nsenter", "-t", ns, "-n", "--", "python3"]
        with (self.logs / "rv-proxy.log").open("ab") as log:
            moved = subprocess.Popen(
                [*in_netns, str(KFP_DIR / "rv-proxy"), str(port + 1), *credentials], stdout=log, stderr=log
            )
        tool_proxy.write_text(str(moved.pid))
        with (self.logs / "upgrade-front.log").open("ab") as log:
            front = subprocess.Popen(
                [*in_netns, str(HERE / "upgrade_front.py"), str(port), str(port + 1), *credentials],
                stdout=log,
                stderr=log,
            )
        self._save_pid("upgrade-front", front.pid)

        def answers() -> bool:
            probe = [
                "nsenter",
                "-t",
                ns,
                "-n",
                "--",
                "curl",
                "-sf",
                "-o",
                "/dev/null",
                f"http://127.0.0.1:{port}/version",
            ]
            return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0

        _wait("the upgrade front and the moved rv-proxy", answers, 30, self.logs / "upgrade-front.log", front)

    def server(self) -> KfpBackend:
        """What this module adds: MariaDB, the API server, the persistence agent."""
        self._timed("mariadb", self.start_database)
        self._timed("api server", self.start_api_server)
        self._timed("persistence agent", self.start_persistence_agent)
        self._timed("scheduled-workflow controller", self.start_scheduled_workflow_controller)
        return self

    def s3_credentials(self) -> tuple[str, str]:
        """The access and secret key ``kfp up`` made for its SeaweedFS (``WORKDIR/kfp/s3/credentials``)."""
        pairs = dict(
            line.split("=", 1) for line in (self.root / "s3" / "credentials").read_text().splitlines() if "=" in line
        )
        return pairs["ACCESS_KEY"], pairs["SECRET_KEY"]

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.cluster.ip()}:9000"

    # -- MariaDB ---------------------------------------------------------------------------------------------
    def start_database(self) -> None:
        folder = self.root / "mariadb"
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "data").mkdir(parents=True)
        installed = subprocess.run(
            [
                "mariadb-install-db", "--no-defaults", f"--datadir={folder / 'data'}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db",
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if installed.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {installed.stderr[-2000:]}")
        log = self.logs / "mariadb.log"
        process = subprocess.Popen(
            [
                "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={folder / 'data'}", "--user=root",
                "--bind-address=127.0.0.1", f"--port={DB_PORT}", f"--socket={folder / 'mysqld.sock'}",
                f"--pid-file={folder / 'mysqld.pid'}", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                f"--log-error={log}",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self._save_pid("mariadb", process.pid)

        def ready() -> bool:
            return (
                subprocess.run(
                    ["mariadb", "--no-defaults", "-S", str(folder / "mysqld.sock"), "-uroot", "-e",
                     "CREATE DATABASE IF NOT EXISTS mlpipeline"],
                    capture_output=True,
                ).returncode
                == 0
            )  # fmt: skip

        _wait("MariaDB", ready, 120, log, process)

    # -- API server ------------------------------------------------------------------------------------------
    def api_environment(self) -> dict[str, str]:
        """The API server's configuration for this cluster (KFP reads these names through viper)."""
        ip = self.cluster.ip()
        access_key, secret_key = self.s3_credentials()
        home = self.root / "apiserver-home"
        (home / ".kube").mkdir(parents=True, exist_ok=True)
        # Its ScheduledWorkflow client reads ~/.kube/config only (not KUBECONFIG), then in-cluster config.
        shutil.copy(self.cluster.kubeconfig, home / ".kube" / "config")
        db = {"USER": "root", "PASSWORD": "", "DBNAME": "mlpipeline", "HOST": "127.0.0.1", "PORT": str(DB_PORT)}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "POD_NAMESPACE": NAMESPACE,
            "DBDRIVERNAME": "mysql",
            "INITCONNECTIONTIMEOUT": "30s",
            **{f"DBCONFIG_{k}": v for k, v in db.items()},
            **{f"DBCONFIG_MYSQLCONFIG_{k}": v for k, v in db.items()},
            # Its own bucket (pipeline uploads); v2 runs' artifacts go where the kfp-launcher ConfigMap says.
            "OBJECTSTORECONFIG_HOST": ip,
            "OBJECTSTORECONFIG_PORT": "9000",
            "OBJECTSTORECONFIG_SECURE": "false",
            "OBJECTSTORECONFIG_REGION": "us-east-1",
            "OBJECTSTORECONFIG_BUCKETNAME": "mlpipeline",
            "OBJECTSTORECONFIG_ACCESSKEY": access_key,
            "OBJECTSTORECONFIG_SECRETACCESSKEY": secret_key,
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_HOST": "127.0.0.1",
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_PORT": "8889",
            "V2_DRIVER_IMAGE": DRIVER_IMAGE,
            "V2_LAUNCHER_IMAGE": LAUNCHER_IMAGE,
            "COMPILED_PIPELINE_SPEC_PATCH": json.dumps({"hostAliases": [{"ip": ip, "hostnames": SERVICE_NAMES}]}),
        }
        return env

    def start_api_server(self) -> None:
        binary = self.root / "bin" / "apiserver"
        if not binary.exists():
            with binary.open("wb") as out:
                subprocess.run(["xz", "-dc", str(KFP_DIR / "apiserver.xz")], stdout=out, check=True, timeout=300)
            binary.chmod(0o755)
        config = self.root / "apiserver-config"
        config.mkdir(exist_ok=True)
        shutil.copy(KFP_DIR / "apiserver-config" / "config.json", config / "config.json")
        log = self.logs / "apiserver.log"
        ip = self.cluster.ip()
        with log.open("w") as out:
            process = subprocess.Popen(
                [
                    str(binary), f"--config={config}", "-logtostderr=true", "--logLevel=info",
                    f"--rpcPortFlag=:{API_GRPC_PORT}", f"--httpPortFlag={ip}:{API_HTTP_PORT}",
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.api_environment(),
                start_new_session=True,
            )  # fmt: skip
        self._save_pid("apiserver", process.pid)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self.host}/apis/v2beta1/healthz", timeout=2) as answer:
                    return answer.status == 200
            except (urllib.error.URLError, OSError):
                return False

        _wait("the KFP API server", ready, 180, log, process)

    # -- the persistence agent and the scheduled-workflow controller, each in a pod ------------------------------
    def start_persistence_agent(self) -> None:
        self.cluster.apply((HERE / "scheduledworkflow-crd.yaml").read_text())  # it watches ScheduledWorkflows too
        self.cluster.kubectl(
            "wait", "--for=condition=established", "--timeout=60s", "crd/scheduledworkflows.kubeflow.org"
        )
        self._start_in_pod("persistence_agent", AGENT_IMAGE, "persistence-agent.yaml", "ml-pipeline-persistenceagent")

    def start_scheduled_workflow_controller(self) -> None:
        self._start_in_pod("scheduledworkflow", SWF_IMAGE, "scheduledworkflow.yaml", "ml-pipeline-scheduledworkflow")

    def _start_in_pod(self, binary_name: str, image: str, manifest: str, pod: str) -> None:
        """Build ``image`` with the tool folder's ``binary_name`` (``kfp/component.Dockerfile``), load it, apply
        ``manifest`` and wait for the pod to be ready."""
        context = self.root / f"{binary_name}-image"
        context.mkdir(exist_ok=True)
        binary = context / binary_name
        if not binary.exists():
            with binary.open("wb") as out:
                subprocess.run(["xz", "-dc", str(KFP_DIR / f"{binary_name}.xz")], stdout=out, check=True, timeout=300)
            binary.chmod(0o755)
        env = {**os.environ, "CONTAINERS_CONF": str(self.root / "img" / "containers.conf")}
        built = subprocess.run(
            [
                "buildah", "bud", "--layers", "--network", "host", "--runtime", "/usr/sbin/runc",
                "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"BINARY={binary_name}",
                "-f", str(HERE / "component.Dockerfile"), "-t", image, str(context),
            ],
            capture_output=True, text=True, timeout=900, env=env,
        )  # fmt: skip
        if built.returncode != 0:
            raise RuntimeError(f"buildah bud of {image} failed:\n{built.stdout[-2000:]}{built.stderr[-2000:]}")
        self.cluster.load_image(image)
        text = (HERE / manifest).read_text()
        self.cluster.apply(text.replace("@HOST_IP@", self.cluster.ip()).replace("@IMAGE@", image))

        def ready() -> bool:
            status = self.cluster.get("pod", pod, NAMESPACE).get("status", {})
            return any(c.get("ready") for c in status.get("containerStatuses", []))

        _wait(f"pod {NAMESPACE}/{pod}", ready, 180)

    # -- down ------------------------------------------------------------------------------------------------
    def _save_pid(self, name: str, pid: int) -> None:
        (self.root / "run").mkdir(parents=True, exist_ok=True)
        (self.root / "run" / f"{name}.pid").write_text(str(pid))

    def _stop(self, name: str, timeout_s: float = 10) -> None:
        path = self.root / "run" / f"{name}.pid"
        if not path.exists():
            return
        pid = int(path.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            path.unlink()
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.killpg(pid, signal.SIGKILL)
        path.unlink()

    def down(self) -> None:
        """Stop what :meth:`up` started (by saved pid), then ``kfp down``; the cluster itself is the caller's."""
        self._stop("apiserver")
        self._stop("mariadb")
        self._stop("upgrade-front")
        if (self.root / "run").exists():
            self._kfp("down", str(self.cluster.workdir), timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args(argv)
    backend = KfpBackend(Cluster(args.workdir.resolve()))
    if args.action == "up":
        backend.up()
        print(f"KFP API server at {backend.host}; " + ", ".join(f"{k} {v:.1f} s" for k, v in backend.timings.items()))
    else:
        backend.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
