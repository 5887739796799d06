"""Runs of the compiled pipeline through the tier's KFP API server, as a user sends and reads them.

``g2rpo pipeline submit --host`` sends a run (a subprocess, as a user runs it); ``kfp.Client().get_run()`` reads it
back as the persistence agent reported it; the Workflow the API server made and its pods are read from the cluster;
what KFP's launcher wrote is read from the pipeline root in S3. Shared by :mod:`tests.cluster.test_cluster_kfp` and
the two-node runs of :mod:`tests.cluster.test_cluster_trainjob`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import kfp

from tests.cluster.deploy import BUCKET, PIPELINE_ROOT, REPO, run_arguments
from tests.cluster.kfp_backend import NAMESPACE as KFP_NAMESPACE
from tests.cluster.trainjob_run import export_weights

EXPERIMENT = "cluster-tier"
PIPELINE = "g2rpo-alignment"
RUN_TIMEOUT_S = 2400
MLMD_PORT = 8080  # ../shared/tools/kfp: mlmd-server on `cluster ip`


def kfp_arguments() -> dict:
    """The tier's smallest shapes run, as ``g2rpo pipeline submit`` takes it: ``node_selector`` is merged over the
    profile's labels, so the H200 label (no such node here) is removed with null rather than an empty map."""
    arguments = run_arguments(BUCKET)
    arguments["node_selector"] = {"nvidia.com/gpu.product": None}
    return arguments


def pipeline_cli(host: str, verb: str, arguments: dict, *flags: str) -> subprocess.CompletedProcess:
    """``g2rpo pipeline VERB --host HOST --experiment … FLAGS NAME=VALUE …`` in a subprocess, as a user runs it."""
    items = [f"{k}={v}" if isinstance(v, str) else f"{k}={json.dumps(v)}" for k, v in arguments.items()]
    command = [sys.executable, "-m", "g2rpo.cli", "pipeline", verb, "--host", host, "--experiment", EXPERIMENT]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*command, *flags, *items], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


def submit(host: str, run_name: str, arguments: dict) -> str:
    """``g2rpo pipeline submit --host``; returns the run id it prints."""
    done = pipeline_cli(host, "submit", arguments, "--run-name", run_name)
    found = re.search(r"submitted run (\S+) ", done.stdout)
    assert done.returncode == 0 and found, (
        f"g2rpo pipeline submit exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return found.group(1)


def tasks(run) -> dict[str, str]:
    """The run's tasks as the API server reports them: display name -> state (the last attempt's, for retries)."""
    out = {}
    if run.run_details is None:  # the API server fills it in once the persistence agent has reported the Workflow
        return out
    details = sorted(run.run_details.task_details or [], key=lambda t: t.create_time or 0)
    for task in details:
        out[task.display_name] = task.state
    return out


def wait_for_end(deployment, run_id: str) -> object:
    """Poll ``kfp.Client().get_run`` until the run ends (or :data:`RUN_TIMEOUT_S` passes); the run as it is then."""
    client = kfp.Client(host=deployment.kfp.host)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run = client.get_run(run_id)
    while run.state not in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED") and time.monotonic() < deadline:
        time.sleep(5)
        run = client.get_run(run_id)
    return run


def wait_for_run(deployment, run_id: str) -> object:
    """:func:`wait_for_end`; on anything but SUCCEEDED raise with its tasks and the end of each failed pod's log."""
    run = wait_for_end(deployment, run_id)
    if run.state != "SUCCEEDED":
        raise AssertionError(
            f"run {run_id} is {run.state} (after {RUN_TIMEOUT_S} s at most); tasks {tasks(run)}\n"
            + failed_pod_logs(deployment, run_id)
        )
    return run


def failed_pod_logs(deployment, run_id: str) -> str:
    cluster = deployment.cluster
    pods = json.loads(cluster.kubectl("-n", KFP_NAMESPACE, "get", "pods", "-o", "json").stdout)["items"]
    out = []
    for pod in pods:
        if pod["status"].get("phase") == "Failed":
            name = pod["metadata"]["name"]
            out.append(f"--- {name}:\n{cluster.logs(name, KFP_NAMESPACE, 'main')[-4000:]}")
    return "\n".join(out) or "(no failed pods)"


def objects(client, prefix: str) -> list[str]:
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def read_json(client, key: str) -> dict:
    return json.loads(read_text(client, key))


def mlmd_outputs(deployment, run_id: str) -> dict:
    """What ML Metadata holds of the run's tasks, where the KFP UI reads it (:mod:`tests.cluster.mlmd_outputs`, run
    with the KFP tool's Python, which has ``ml-metadata``): task -> ``{"executions": [{type, state}], "outputs":
    {output name: {type, uri, properties}}}``."""
    python = deployment.kfp.root / "venv" / "bin" / "python"
    script = Path(__file__).with_name("mlmd_outputs.py")
    done = subprocess.run(
        [str(python), str(script), deployment.cluster.ip(), str(MLMD_PORT), run_id],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"mlmd_outputs.py exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def read_text(client, key: str) -> str:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()


def output_key(keys: list[str], task: str, output: str, name: str = "") -> str:
    """The key of ``<root>/<pipeline>/<run>/<task>/<uuid>/<output>[/<name>]`` among ``keys`` (KFP's layout)."""
    pattern = re.compile(
        rf"/{re.escape(task)}/[0-9a-f-]{{36}}/{re.escape(output)}" + (f"/{re.escape(name)}$" if name else "$")
    )
    found = [k for k in keys if pattern.search(k)]
    assert len(found) == 1, (task, output, name, found)
    return found[0]


def trained_weights(deployment, run_id: str) -> tuple[dict, dict[str, str], list[str]]:
    """A run's train record (its ``model`` artifact in S3), the sha256 of its export's weight files, its keys."""
    client = deployment.client()
    keys = objects(client, f"{PIPELINE_ROOT.removeprefix(f's3://{BUCKET}/')}/{PIPELINE}/{run_id}/")
    record = read_json(client, output_key(keys, "train", "model", "record.json"))
    return record, export_weights(deployment, record["export_uri"]), keys


def wait_for_workflow(deployment, run_id: str, timeout_s: float = 120) -> str:
    """The name of the Workflow the API server made for the run, once it exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = deployment.cluster.kubectl(
            "-n", KFP_NAMESPACE, "get", "wf", "-l", f"pipeline/runid={run_id}", "-o", "name"
        ).stdout.split()
        if listed:
            return listed[0].split("/")[-1]
        time.sleep(0.5)
    raise AssertionError(f"run {run_id}: no Workflow labelled pipeline/runid={run_id} after {timeout_s} s")


def workflow_of(deployment, run_id: str) -> dict:
    """The Argo Workflow the API server made for the run (it labels it ``pipeline/runid``)."""
    listed = deployment.cluster.kubectl(
        "-n", KFP_NAMESPACE, "get", "wf", "-l", f"pipeline/runid={run_id}", "-o", "json"
    )
    (workflow,) = json.loads(listed.stdout)["items"]
    return workflow


def run_pods(deployment, workflow: str) -> dict[str, str]:
    """The Workflow's pods (Argo labels each with its Workflow's name): name -> phase."""
    selector = f"workflows.argoproj.io/workflow={workflow}"
    listed = deployment.cluster.kubectl("-n", KFP_NAMESPACE, "get", "pods", "-l", selector, "-o", "json")
    return {p["metadata"]["name"]: p["status"].get("phase", "") for p in json.loads(listed.stdout)["items"]}


def executor_pods(deployment, run_id: str, task: str) -> list[dict]:
    """The run's executor pods of ``task`` as Argo made them (KFP's launcher as init container), oldest first."""
    workflow = workflow_of(deployment, run_id)["metadata"]["name"]
    listed = deployment.cluster.kubectl(
        "-n", KFP_NAMESPACE, "get", "pods", "-l", f"workflows.argoproj.io/workflow={workflow}", "-o", "json"
    )
    pods = [
        p
        for p in json.loads(listed.stdout)["items"]
        if f".{task}." in p["metadata"].get("annotations", {}).get("workflows.argoproj.io/node-name", "")
        and any(c["name"] == "kfp-launcher" for c in p["spec"].get("initContainers", []))
    ]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])
