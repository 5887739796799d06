"""Two nodes for real: the TrainJob's pods as two hosts on this machine, rendezvousing over a veth pair.

The launcher's TrainJob goes through Kubeflow Trainer v2.3.0's own JobSet build
(``../shared/tools/trainer-check``) with the chart's runtime; each of two network namespaces (its own
address on a veth pair, its own ``/etc/hosts`` naming the JobSet's master pod) then runs the node
pod's exact command with its environment: the Trainer's torch variables (``PET_NNODES``,
``PET_NODE_RANK`` from the completion index, ``PET_MASTER_ADDR``/``PORT``), the run config in
``G2RPO_RUN_CONFIG``. They train a tiny Flux with DeepSpeed ZeRO-2 on gloo, node 1 is SIGKILLed in
iteration 3 (after checkpoint 2), both start again and resume, and the exported weights equal those of a
one-node run with the same global batch (2 ranks: ``torchrun --standalone --nproc_per_node 2``).

Departures from a cluster, each for a reason: the Secret's env is left out (the tiny run reads no S3);
the two hosts share this machine's file system, standing in for the chart's shared volume
(``trainingRuntime.sharedVolume``, here mounted at a folder of this machine), where the launcher puts
``output.dir``. One GPU per node is asked for, so the command runs one rank per "node"
(``--nproc-per-node=1``; the runtime's ``auto`` would mean one per CPU core here).

Slow (three DeepSpeed runs on the CPU) and root-only (``ip netns add``, which CI's runner allows):
skipped, saying why, where namespaces cannot be made or the tool is absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from kubeapi import KubeAPI, condition
from test_trainer_check import PLACEMENTS, TOOL, trainer_check

from g2rpo.config import load_config, to_yaml
from g2rpo.faults import fault_env
from g2rpo.launch.trainjob import TRAINING_RUNTIME, TrainJobLaunch, launch_trainjob
from g2rpo.training.run_config import RunConfig
from tests.chart.chart_render import training_runtime
from tests.tiny_flux_fixture import make_tiny_flux
from tests.trainer.trainer_testlib import REPO, export_weights, subprocess_env, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(3600)]

SUBNET = "10.231.7"
RUN_S = 1200  # one two-node run on two shared CPU cores


def _why_no_namespaces() -> str | None:
    if not TOOL.is_file():
        return f"../shared/tools/trainer-check is not beside this checkout ({TOOL}); CI has it"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = f"g2rpo-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


@pytest.fixture(scope="module")
def hosts():
    """Two namespaces joined by a veth pair: [(name, address), (name, address)]."""
    reason = _why_no_namespaces()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:6]
    names = [f"g2rpo-n0-{tag}", f"g2rpo-n1-{tag}"]
    pair = [f"g2v0{tag}", f"g2v1{tag}"]
    addresses = [f"{SUBNET}.1", f"{SUBNET}.2"]
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "link", "add", pair[0], "type", "veth", "peer", "name", pair[1]], check=True)
        for name, link, address in zip(names, pair, addresses):
            subprocess.run(["ip", "link", "set", link, "netns", name], check=True)
            inside = ["ip", "netns", "exec", name, "ip"]
            subprocess.run([*inside, "addr", "add", f"{address}/24", "dev", link], check=True)
            subprocess.run([*inside, "link", "set", link, "up"], check=True)
            subprocess.run([*inside, "link", "set", "lo", "up"], check=True)
        yield list(zip(names, addresses))
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("netns_tiny_flux"))


def _config(tiny_model: Path, out: Path) -> RunConfig:
    overrides = tiny_overrides(
        tiny_model, out, **{"train.iterations": 4, "train.prompts_per_iteration": 4, "deepspeed.enabled": True}
    )
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(overrides))
    return load_config(RunConfig, path)


def _node_pod(config: RunConfig, work: Path) -> tuple[dict, Path]:
    """The node pods' container, as the Trainer builds the JobSet from the launcher's TrainJob, and the run's
    output.dir: the chart's shared volume (here a folder of this machine, which both "nodes" see) / the job."""
    shared = work / "shared-runs"
    shared.mkdir()
    runtime = training_runtime({"trainingRuntime": {"sharedVolume": {"claimName": "runs", "mountPath": str(shared)}}})
    done_at_once = {"conditions": [condition("Complete", "all nodes succeeded")]}
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime, script=lambda job, polls: done_at_once) as api:
        launch = TrainJobLaunch(
            image="ghcr.io/g2rpo/g2rpo-trainer:0.1.0",
            run_id="netns-two-nodes",
            task="train",
            namespace="team-a",
            placement=replace(PLACEMENTS["h200-profile"], gpus_per_node=1),  # one rank per "node"
            s3_secret="g2rpo-s3",
            wait_timeout_s=30,
            poll_interval_s=1,
            client_configuration=api.configuration(),
        )
        args = ["--checkpoint-uri", (work / "mirror").as_uri()]
        launch_trainjob(launch, args, config_yaml=to_yaml(config), nodes=2, echo=lambda _: None)
    (job,) = [c["body"] for c in api.calls if c["method"] == "POST"]
    job["metadata"].setdefault("namespace", "team-a")
    checked, jobset = trainer_check(job, runtime, work / "trainer-check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (node,) = jobset["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    return container, shared / job["metadata"]["name"]


def _node_env(container: dict, rank: int, fault: str | None) -> dict[str, str]:
    env = {}
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif "job-completion-index" in variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", ""):
            env[variable["name"]] = str(rank)  # the pod's completion index: its node rank
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "auto"  # the command's flag wins
    local = subprocess_env()  # this checkout on PYTHONPATH, one thread, the DeepSpeed op cache
    env.update({k: local[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS", "TORCH_EXTENSIONS_DIR", "HOME")})
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # torchrun, as on the image's PATH
    if fault:
        env.update(fault_env(fault))
    return env


def _run_two_nodes(hosts, container: dict, work: Path, fault_on_node1: str | None = None) -> list[int]:
    master = container_env_value(container, "PET_MASTER_ADDR")
    for name, address in hosts:
        # As the kubelet writes a pod's /etc/hosts: its own hostname is its address (gloo picks the address
        # it advertises by resolving the hostname), and the JobSet's headless service names node 0.
        etc = Path("/etc/netns") / name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n{hosts[0][1]} {master}\n")
    command = [*container["command"], *container.get("args", [])]
    procs = []
    for rank, (name, _) in enumerate(hosts):
        env = _node_env(container, rank, fault_on_node1 if rank == 1 else None)
        log = (work / f"node{rank}.log").open("w")
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", name, "env", "-i", *[f"{k}={v}" for k, v in env.items()], *command],
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=RUN_S))
        except subprocess.TimeoutExpired:  # a node left waiting for a dead peer: the JobSet would fail it
            os.killpg(proc.pid, 9)
            codes.append(proc.wait())
    return codes


def container_env_value(container: dict, name: str) -> str:
    return next(v["value"] for v in container["env"] if v["name"] == name)


def test_two_netns_nodes_train_zero2_lose_a_node_resume_and_match_one_node(hosts, tiny_model, tmp_path):
    tmp_path.chmod(0o755)
    # One node, two ranks: the reference with the same global batch.
    reference = _config(tiny_model, tmp_path / "one-node")
    (tmp_path / "one-node-run.yaml").write_text(to_yaml(reference))
    one_node = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + ["-m", "g2rpo", "train", "--config", str(tmp_path / "one-node-run.yaml")],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert one_node.returncode == 0, one_node.stderr[-4000:]

    container, out = _node_pod(_config(tiny_model, tmp_path / "two-nodes"), tmp_path)
    assert container["command"][:2] == ["bash", "-c"]
    assert "exec python -m g2rpo.launch.torchrun --nproc-per-node=1 -m g2rpo train" in container["command"][2]

    codes = _run_two_nodes(hosts, container, tmp_path, fault_on_node1="iteration:3")
    log = "\n".join((tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1))
    assert codes[1] != 0 and not (out / "export").exists(), log
    shards = sorted(p.name for p in (out / "checkpoints" / "iter-000002" / "deepspeed" / "state").iterdir())
    assert sum("optim_states" in s for s in shards) == 2, shards  # one ZeRO-2 shard per node's rank

    codes = _run_two_nodes(hosts, container, tmp_path)
    log = "\n".join((tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1))
    assert codes == [0, 0], log
    assert "resum" in (tmp_path / "node0.log").read_text().lower()

    mine, theirs = export_weights(out), export_weights(tmp_path / "one-node")
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
