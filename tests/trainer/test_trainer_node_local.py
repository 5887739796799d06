"""Multi-node without a shared volume: S3 is the only store every node sees (``output.node_local``).

Two torchrun "nodes" on loopback (``--nnodes 2``, one rank each), each with its own ``output.dir`` and
no folder in common, train a tiny Flux with DeepSpeed ZeRO-2 on gloo and mirror their checkpoints to
a real SeaweedFS. Node 1 is SIGKILLed in the mirror's publish of checkpoint 4, before it uploads its
part (fail point ``mirror_part:4``): the prefix then holds node 0's part only and no manifest, so the
mirror's newest complete checkpoint stays 2. Both nodes start again in fresh, empty folders, restore
checkpoint 2 from S3, and the exported weights equal, bit for bit, those of an undisturbed one-node
run of two ranks with the same global batch. That S3 checkpoint 4 (written by two nodes) then
resumes on one process — another world size — and ends bit-identical to the undisturbed run resumed
on one process from its own checkpoint 4; and that one process's checkpoint 6 resumes on two nodes again
(more nodes than wrote it), bit-identical to the undisturbed run resumed on two ranks from its own.

Nine DeepSpeed starts on two shared CPU cores (each ~25-60 s): one test, integration tier. The
refusals (no mirror, the best validated export, two nodes in one folder) follow, without DeepSpeed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_testlib import REPO, as_cli, export_weights, subprocess_env, tiny_overrides

from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME, read_manifest, write_dir_manifest
from g2rpo.artifacts.publish import claim_prefix
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import ConfigError, G2RPOError
from g2rpo.faults import fault_env
from g2rpo.steps.train import train_and_publish
from g2rpo.training.checkpoint import PART_KIND
from g2rpo.training.mirror import CheckpointMirror, _Part
from g2rpo.training.run_config import load_run_config
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

RUN_S = 900  # one run on two shared CPU cores


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("node_local_tiny_flux"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tiny_model: Path, out: Path, iterations: int = 4, node_local: bool = True) -> dict:
    return tiny_overrides(
        tiny_model,
        out,
        **{
            "train.iterations": iterations,
            "train.prompts_per_iteration": 4,
            "deepspeed.enabled": True,
            "deepspeed.zero_stage": 2,
            "output.node_local": node_local,
        },
    )


def _base(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    base = where / "base.yaml"
    base.write_text("{}\n")
    return base


def _two_nodes(
    tiny_model: Path, outs: list[Path], uri: str, work: Path, fault_on_node1: str | None = None, iterations: int = 4
):
    """Both nodes' torchrun, each with its own output.dir; returns their exit codes and logs."""
    port = _free_port()
    procs = []
    for node, out in enumerate(outs):
        env = subprocess_env()  # carries the s3_env fixture's AWS_* variables
        if node == 1 and fault_on_node1:
            env.update(fault_env(fault_on_node1))
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        command += ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
        command += ["-m", "g2rpo", "train", "--config", str(_base(work)), *as_cli(_config(tiny_model, out, iterations))]
        command += ["--checkpoint-uri", uri]
        log = (work / f"{out.name}.log").open("w")
        procs.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=RUN_S))
        except subprocess.TimeoutExpired:  # a node left waiting for a dead peer
            proc.kill()
            codes.append(proc.wait())
    logs = [(work / f"{out.name}.log").read_text() for out in outs]
    return codes, logs


def _one_process(config: dict, work: Path, uri: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "g2rpo", "train", "--config", str(_base(work)), *as_cli(config)]
    if uri is not None:
        command += ["--checkpoint-uri", uri]
    return subprocess.run(command, env=subprocess_env(), cwd=REPO, capture_output=True, text=True, timeout=RUN_S)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    assert not [k for k in a if not torch.equal(a[k], b[k])]


def test_two_nodes_without_a_shared_folder_checkpoint_to_s3_lose_a_node_and_resume_there_and_on_one(
    tiny_model, s3_env, tmp_path
):
    # The reference: one node, two ranks, one folder, no mirror (the same global batch of 4 prompts).
    reference = tmp_path / "one-node"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "g2rpo", "train", "--config", str(_base(tmp_path / "ref"))]
        + as_cli(_config(tiny_model, reference, node_local=False)),
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    # Two nodes, a folder each; node 1 dies in the publish of checkpoint 4, before its upload.
    uri = f"{s3_env.uri}/runs/two-nodes/checkpoints"
    first = [tmp_path / "first" / "node0", tmp_path / "first" / "node1"]
    codes, logs = _two_nodes(tiny_model, first, uri, tmp_path / "first", fault_on_node1="mirror_part:4")
    assert codes[1] != 0 and codes[0] != 0, "\n".join(log[-3000:] for log in logs)
    assert "G2RPO_FAULT_KILL_AT=mirror_part:4" in logs[1]
    mirror = CheckpointMirror(uri, keep_last=2)
    assert mirror.complete() == [2]  # 4 has node 0's part only: not a checkpoint
    store = open_store(uri)
    keys = {info.key for info in store.list()}
    assert f"iter-000004/{MANIFEST_NAME}" not in keys
    assert "iter-000004/trainer_state.json" in keys  # node 0 (global rank 0) uploaded its part
    assert "iter-000004/ranks/rank-00001.pt" not in keys  # node 1 died before its upload
    # Each node's folder holds its own part only; checkpoint 2 in S3 holds both, under one manifest.
    assert not (first[1] / "checkpoints" / "iter-000002" / "trainer_state.json").exists()
    assert (first[1] / "checkpoints" / "iter-000002" / "ranks" / "rank-00001.pt").is_file()
    assert not (first[0] / "checkpoints" / "iter-000002" / "ranks" / "rank-00001.pt").exists()
    whole = read_manifest(store, "iter-000002")
    paths = {entry.path for entry in whole.files}
    assert {"trainer_state.json", "ranks/rank-00000.pt", "ranks/rank-00001.pt"} <= paths
    assert sum("optim_states" in p for p in paths) == 2  # one ZeRO-2 shard per node's rank
    assert whole.metadata["kind"] == "resumable-checkpoint" and whole.metadata["nodes"] == 2

    # Both nodes start again in fresh, empty folders: they restore checkpoint 2 from S3 and finish.
    second = [tmp_path / "second" / "node0", tmp_path / "second" / "node1"]
    codes, logs = _two_nodes(tiny_model, second, uri, tmp_path / "second")
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert [e["iteration"] for e in _events(second[0]) if e.get("event") == "resumed"] == [2]
    assert (second[1] / "checkpoints" / "iter-000002" / "trainer_state.json").is_file()  # restored whole
    _assert_same_weights(export_weights(second[0]), export_weights(reference))
    assert mirror.complete() == [2, 4]
    assert read_manifest(store, "iter-000004").metadata["world_size"] == 2

    # Another world size: S3 checkpoint 4 of two nodes resumes on one process and trains on to 6, as the
    # undisturbed run's own checkpoint 4 does on one process.
    one = tmp_path / "one-process"
    resized = _one_process(_config(tiny_model, one, iterations=6), tmp_path / "one", uri)
    assert resized.returncode == 0, resized.stderr[-4000:]
    assert "saved by 2 rank(s), on 1" in resized.stderr
    assert [e["iteration"] for e in _events(one) if e.get("event") == "resumed"] == [4]
    assert mirror.complete() == [4, 6]
    assert read_manifest(store, "iter-000006").metadata["world_size"] == 1
    longer = _one_process(_config(tiny_model, reference, iterations=6, node_local=False), tmp_path / "ref")
    assert longer.returncode == 0, longer.stderr[-4000:]
    _assert_same_weights(export_weights(one), load_beside(reference, 6))

    # More nodes than wrote it: that one-process checkpoint 6 resumes on two nodes, each in a fresh folder, and
    # trains on to 8, as the undisturbed run's own checkpoint 6 does on two ranks of one node.
    third = [tmp_path / "third" / "node0", tmp_path / "third" / "node1"]
    codes, logs = _two_nodes(tiny_model, third, uri, tmp_path / "third", iterations=8)
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "saved by 1 rank(s), on 2" in logs[0] + logs[1]
    assert [e["iteration"] for e in _events(third[0]) if e.get("event") == "resumed"] == [6]
    assert mirror.complete() == [6, 8]
    assert read_manifest(store, "iter-000008").metadata["world_size"] == 2
    grown = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "g2rpo", "train", "--config", str(_base(tmp_path / "ref"))]
        + as_cli(_config(tiny_model, reference, iterations=8, node_local=False)),
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert grown.returncode == 0, grown.stderr[-4000:]
    _assert_same_weights(export_weights(third[0]), load_beside(reference, 8))


def load_beside(out: Path, iteration: int) -> dict[str, torch.Tensor]:
    """The export a longer run resumed after an earlier export writes beside it."""
    return load_file(str(out / f"export-iter-{iteration:06d}" / "transformer" / "diffusion_pytorch_model.safetensors"))


# ---------------------------------------------------------------------------- refusals, before any work


def test_node_local_folders_need_a_checkpoint_mirror_and_cannot_export_the_best_validated(tmp_path):
    overrides = [
        f"model.path={tmp_path / 'model'}",
        f"data.prompts={tmp_path / 'prompts.txt'}",
        "deepspeed.enabled=true",
        f"output.dir={tmp_path / 'run'}",
        "output.node_local=true",
    ]
    with pytest.raises(G2RPOError) as info:
        train_and_publish(load_run_config(None, overrides))
    message = str(info.value)
    assert "output.node_local=True" in message and "--checkpoint-uri s3://" in message
    assert "output.node_local=false" in message and not (tmp_path / "run").exists()

    with pytest.raises(ConfigError) as refused:
        load_run_config(None, [*overrides, "train.validation.enabled=true"])
    (problem,) = [p for p in refused.value.problems if "node_local" in p]
    assert problem.startswith("train.validation.select_best=True") and "select_best=false" in problem
    load_run_config(None, [*overrides, "train.validation.enabled=true", "train.validation.select_best=false"])


def test_two_nodes_holding_the_same_file_are_one_folder_and_nothing_is_published(s3_env, tmp_path):
    # The rank-0 end of CheckpointMirror.publish_parts, given what two nodes reported after uploading: both
    # hold ranks/rank-00000.pt, so their output.dir is one folder (node_local set for a shared volume).
    part = tmp_path / "iter-000002"
    (part / "ranks").mkdir(parents=True)
    (part / "ranks" / "rank-00000.pt").write_bytes(b"rng")
    (part / "trainer_state.json").write_text("{}")
    write_dir_manifest(part, producer="test", config_hash="abc", metadata={"kind": PART_KIND, "node": 0})
    files = [e.model_dump() for e in read_manifest(open_store(str(part))).files]
    mirror = CheckpointMirror(f"{s3_env.uri}/mirror", keep_last=2)
    for entry in files:
        mirror.store.put_file(f"iter-000002/{entry['path']}", part / entry["path"])
    claim = claim_prefix(mirror.uri_of(2), producer="test")
    reports = [_Part(0, files, None), _Part(1, [files[0]], None)]
    said = mirror._seal_parts(claim, reports, part, 2)
    assert said is not None and "was not mirrored" in said
    assert "output.node_local=True: nodes 0 and 1 both hold ranks/rank-00000.pt of iter-000002" in said
    keys = {info.key for info in mirror.store.list()}
    assert f"iter-000002/{MANIFEST_NAME}" not in keys and f"iter-000002/{MARKER_NAME}" not in keys
    assert mirror.complete() == []
    # The same parts from distinct folders are published, the manifest over both, last.
    claim = claim_prefix(mirror.uri_of(2), producer="test")
    assert mirror._seal_parts(claim, [_Part(0, files[1:], None), _Part(1, files[:1], None)], part, 2) is None
    whole = read_manifest(mirror.store, "iter-000002")
    assert [e.path for e in whole.files] == ["ranks/rank-00000.pt", "trainer_state.json"]
    assert whole.metadata == {"kind": "resumable-checkpoint", "nodes": 2}
    assert mirror.complete() == [2]
