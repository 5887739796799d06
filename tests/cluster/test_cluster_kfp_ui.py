"""What a KFP user sees: the Kubeflow Pipelines 2.17.0 UI against the tier's API server, ML Metadata and S3, looked at
in headless Chromium.

Opt-in: it runs when ``G2RPO_KFP_UI`` names a folder ``tests/cluster/kfp_ui/build.sh`` built the UI in (the frontend
of kubeflow/pipelines at tag 2.17.0 needs its source and about 3 minutes of npm; CI has neither, so there it skips).
The UI's own Node server (``frontend/server/dist/server.js``) serves the built app, proxies the API server and reads
artifacts from S3; its browser code reaches ML Metadata by grpc-web, which a cluster serves with Envoy. Envoy is not
packaged for this machine (Debian, PyPI, npm), so ``kfp_ui/grpc_web_proxy.py`` (unary calls, what the UI uses) stands
in for it — the one part of the page's path that is not Kubeflow's. Screenshots go to ``G2RPO_KFP_UI_SHOTS`` (default:
the test's tmp folder).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import websocket
import yaml

from tests.cluster.kfp_backend import NAMESPACE as KFP_NAMESPACE
from tests.cluster.kfp_runs import MLMD_PORT, mlmd_outputs
from tests.cluster.test_cluster_kfp import STEPS

UI = os.environ.get("G2RPO_KFP_UI", "")
HERE = Path(__file__).resolve().parent / "kfp_ui"

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not UI, reason="G2RPO_KFP_UI is not set: build the KFP UI with tests/cluster/kfp_ui/build.sh (docs/cluster.md)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ui_kubeconfig(cluster, path: Path) -> Path:
    """The UI server's own view of Kubernetes: KFP's ``ml-pipeline-ui`` service account in ``kubeflow``, allowed to
    read Secrets there and nothing else here. The launcher records each artifact's store as the Secret that holds its
    keys (``g2rpo-s3``, ``fromEnv: false``), and the UI's server reads that Secret before it fetches the file; a
    server that cannot reach Kubernetes shows "Error in retrieving HTML visualization information"."""
    account = "ml-pipeline-ui"
    meta = {"name": account, "namespace": KFP_NAMESPACE}
    rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    subject = {"kind": "ServiceAccount", **meta}
    manifests = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta, "subjects": [subject],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}},
    ]  # fmt: skip
    cluster.apply(yaml.safe_dump_all(manifests))
    token = cluster.kubectl("-n", KFP_NAMESPACE, "create", "token", account, "--duration=2h").stdout.strip()
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": server["name"], "user": account, "namespace": KFP_NAMESPACE}}
        ],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _wait_for(url: str, what: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{what} did not answer {url} in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


class Browser:
    """Headless Chromium driven over its DevTools protocol (a websocket; ``websocket-client`` comes with the
    ``kubernetes`` client): open a page, wait until a script says it is ready, click, read its text, screenshot."""

    def __init__(self, profile: Path):
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        assert chromium, "chromium is not installed (`make install` installs Debian's chromium)"
        port = _free_port()
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1600,1000"]
            + [f"--remote-debugging-port={port}", "--remote-allow-origins=*", f"--user-data-dir={profile}"]
            + ["about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as answer:
                    pages = [t for t in json.load(answer) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "chromium's DevTools endpoint did not come up in 60 s"
            time.sleep(0.5)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60)
        self.calls = 0

    def call(self, method: str, **params) -> dict:
        self.calls += 1
        self.ws.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.calls:
                assert "error" not in message, (method, message["error"])
                return message["result"]

    def evaluate(self, script: str):
        return self.call("Runtime.evaluate", expression=script, returnByValue=True)["result"].get("value")

    def wait_for(self, script: str, what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(script):
            assert time.monotonic() < deadline, f"{what}: not shown in {timeout_s:.0f} s; the page says:\n{self.text()}"
            time.sleep(0.5)
        time.sleep(1.0)  # the graph's layout settles after its nodes appear

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def fit_graph(self) -> None:
        """Press the graph's fit-view control, as a user does when a layer opens with its nodes out of view."""
        if self.evaluate("!!document.querySelector('.react-flow__controls-fitview')"):
            self.evaluate("document.querySelector('.react-flow__controls-fitview').click()")
            time.sleep(1.0)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def kfp_ui(deployment, tmp_path):
    """The UI's Node server and the grpc-web proxy, on loopback; yields the UI's URL."""
    root = Path(UI)
    server = root / "src" / "frontend" / "server"
    assert (server / "dist" / "server.js").is_file(), f"{root}: no built UI (run tests/cluster/kfp_ui/build.sh)"
    ip, api_port = deployment.kfp.host.removeprefix("http://").rsplit(":", 1)
    s3_host, s3_port = deployment.s3.endpoint_url.removeprefix("http://").rsplit(":", 1)
    proxy_port, ui_port = _free_port(), _free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    proxy_log, ui_log = logs / "grpc_web_proxy.log", logs / "ui_server.log"
    proxy = subprocess.Popen(
        [str(deployment.kfp.root / "venv" / "bin" / "python"), str(HERE / "grpc_web_proxy.py")]
        + ["--listen", f"127.0.0.1:{proxy_port}", "--upstream", f"{ip}:{MLMD_PORT}"],
        stdout=proxy_log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    keys = {"key": deployment.s3.access_key, "secret": deployment.s3.secret_key}
    env = {
        "PATH": os.environ["PATH"],
        "ML_PIPELINE_SERVICE_HOST": ip,
        "ML_PIPELINE_SERVICE_PORT": api_port,
        "ML_PIPELINE_SERVICE_SCHEME": "http",
        "METADATA_ENVOY_SERVICE_SERVICE_HOST": "127.0.0.1",
        "METADATA_ENVOY_SERVICE_SERVICE_PORT": str(proxy_port),
        "METADATA_ENVOY_SERVICE_SERVICE_SCHEME": "http",
        # S3: the UI's minio client (MINIO_*), its AWS client for s3:// URIs (AWS_*), and the port it cannot
        # otherwise be given (MINIO_ENDPOINT_REWRITE); MINIO_NAMESPACE empty, or the host becomes <host>.kubeflow.
        "MINIO_HOST": s3_host,
        "MINIO_PORT": s3_port,
        "MINIO_NAMESPACE": "",
        "MINIO_SSL": "false",
        "MINIO_ACCESS_KEY": keys["key"],
        "MINIO_SECRET_KEY": keys["secret"],
        "AWS_ACCESS_KEY_ID": keys["key"],
        "AWS_SECRET_ACCESS_KEY": keys["secret"],
        "AWS_REGION": "us-east-1",
        "AWS_S3_ENDPOINT": s3_host,
        "AWS_SSL": "false",
        "MINIO_ENDPOINT_REWRITE": f"{s3_host}=http://{s3_host}:{s3_port}",
        # Kubernetes, for the Secret an artifact's store names (the server's namespace: where the Secret is).
        "KUBECONFIG": str(_ui_kubeconfig(deployment.cluster, logs / "kubeconfig")),
        "FRONTEND_SERVER_NAMESPACE": KFP_NAMESPACE,
        "DISABLE_GKE_METADATA": "true",
        "ENABLE_AUTHZ": "false",
    }
    ui = subprocess.Popen(
        [str(root / "bin" / "node"), "dist/server.js", "../build", str(ui_port)],
        cwd=server, env=env, stdout=ui_log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{ui_port}"
        _wait_for(f"{url}/apis/v2beta1/healthz", "the KFP UI server", ui, ui_log)
        yield url
    finally:
        for proc in (ui, proxy):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_kfp_ui_shows_the_promoted_run_its_tasks_and_its_metrics(deployment, kfp_ui, tmp_path, capsys):
    first = deployment.runs.get("first")
    if first is None:
        pytest.skip("the first KFP run did not run (tests/cluster/test_cluster_kfp.py makes it)")
    shots = Path(os.environ.get("G2RPO_KFP_UI_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    browser = Browser(tmp_path / "chromium")
    try:
        # The run's page: the root layer holds the exit handler's group and report-status; the group opened (its
        # expand button, as a user clicks it) shows each task with the state ML Metadata holds (through grpc-web).
        browser.open(f"{kfp_ui}/#/runs/details/{first}")
        browser.wait_for("!!document.querySelector('[data-testid=expand-button]')", "the run's graph")
        shown = browser.text()
        assert "cluster-tier-first" in shown and "report status" in shown, shown
        browser.screenshot(shots / "kfp-ui-run-root.png")
        browser.evaluate("document.querySelector('[data-testid=expand-button]').click()")
        # The exit handler's layer holds the four tasks before the gate and the gate's condition group ("gates-passed");
        # promote sits one layer further in, behind that group's own expand button.
        inside_gate = {"promote"}
        labels = [step.replace("-", " ") for step in STEPS if step != "report-status" and step not in inside_gate]
        labels.append("gates-passed")
        browser.wait_for(f"{labels!r}.every(l => document.body.innerText.includes(l))", f"the tasks {labels}")
        browser.fit_graph()
        browser.screenshot(shots / "kfp-ui-run.png")

        # decide's decision report (a system.HTML artifact) as the UI shows it: its node clicked, the side panel's
        # Visualization tab, which fetches the file from S3 through the UI's server and renders it in an iframe.
        browser.evaluate("document.querySelector('.react-flow__node[data-id=\"artifact.decide.report\"]').click()")
        browser.wait_for(
            "[...document.querySelectorAll('button')].some(b => b.innerText.trim() === 'Visualization')",
            "the report artifact's side panel",
        )
        browser.evaluate(
            "[...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Visualization').click()"
        )
        browser.wait_for(
            "[...document.querySelectorAll('iframe')].some(f => (f.srcdoc || '').includes('promotion decision'))",
            "the decision report rendered from S3",
            timeout_s=60,
        )
        browser.screenshot(shots / "kfp-ui-report.png")

        browser.evaluate("document.querySelector('[data-testid=expand-button]').click()")
        browser.wait_for("document.body.innerText.includes('promote')", "the gate's promote task")
        browser.fit_graph()
        browser.screenshot(shots / "kfp-ui-run-gate.png")

        # The evaluate task's metrics artifact as the UI's artifact page lists it: the values ML Metadata holds.
        metrics = mlmd_outputs(deployment, first)["evaluate"]["outputs"]["metrics"]
        browser.open(f"{kfp_ui}/#/artifacts/{metrics['id']}")
        browser.wait_for("document.body.innerText.includes('challenger.')", "the metrics artifact's properties")
        browser.screenshot(shots / "kfp-ui-metrics.png")
        shown = browser.text()
        for name, value in metrics["properties"].items():
            if name.startswith("challenger."):
                assert name in shown and str(value)[:5] in shown, (name, value, shown)
    finally:
        browser.close()
    with capsys.disabled():
        print(f"\nKFP UI: run {first} and its metrics artifact rendered in {time.monotonic() - started:.1f} s: {shots}")
