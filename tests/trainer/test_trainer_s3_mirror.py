"""Training that survives a lost pod: checkpoints mirrored to S3 (SeaweedFS), a SIGKILLed run
started again in a fresh working directory resumes from the mirror and ends bit-identical to an
uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_testlib import REPO, as_cli, export_weights, run_train, subprocess_env, tiny_overrides

from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME, write_dir_manifest
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import G2RPOError
from g2rpo.faults import fault_env
from g2rpo.training.checkpoint import CheckpointManager, TrainerState, is_complete
from g2rpo.training.mirror import CheckpointMirror
from g2rpo.training.validation import VALIDATION_FILE, ValidationRecord
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ITERATIONS = 6


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("mirror_tiny_flux"))


def _train(config: dict, checkpoint_uri: str, fault: str | None = None) -> subprocess.CompletedProcess:
    out = Path(config["output"]["dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    base = out.parent / f"{out.name}-base.yaml"
    base.write_text("{}\n")
    env = subprocess_env()
    if fault:
        env.update(fault_env(fault))
    command = [sys.executable, "-m", "g2rpo", "train", "--config", str(base), *as_cli(config)]
    return subprocess.run(
        [*command, "--checkpoint-uri", checkpoint_uri], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_sigkilled_run_resumes_from_s3_in_a_fresh_directory_bit_identical(tiny_model, s3_env, tmp_path):
    straight = tmp_path / "straight"
    done = run_train(tiny_overrides(tiny_model, straight, **{"train.iterations": ITERATIONS}))
    assert done.returncode == 0, done.stderr[-3000:]

    uri = f"{s3_env.uri}/runs/run-1/checkpoints"
    first_pod = tmp_path / "pod-1"
    killed = _train(tiny_overrides(tiny_model, first_pod, **{"train.iterations": ITERATIONS}), uri, "iteration:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    mirror = CheckpointMirror(uri, keep_last=2)
    assert mirror.complete() == [2]  # checkpoint 2 was mirrored before the kill in iteration 3

    second_pod = tmp_path / "pod-2"  # a new pod: nothing of the first one's disk
    resumed = _train(tiny_overrides(tiny_model, second_pod, **{"train.iterations": ITERATIONS}), uri)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = [json.loads(line) for line in (second_pod / "metrics.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in events if e.get("event") == "resumed"] == [2]
    assert [e["iteration"] for e in events if "prompt_indices" in e] == [2, 3, 4, 5]
    a, b = export_weights(straight), export_weights(second_pod)
    assert a.keys() == b.keys() and a
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    assert mirror.complete() == [4, 6]  # retention as locally: the last two


@pytest.fixture(params=["file", "s3"])
def root_uri(request, tmp_path):
    """A fresh mirror root: a local folder as a file:// URI, or a prefix in a fresh bucket on SeaweedFS."""
    if request.param == "file":
        return (tmp_path / "mirror").as_uri()
    return f"{request.getfixturevalue('s3_env').uri}/mirror"


class _FileDriver:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir()
        (directory / "torch" / "model.pt").write_bytes(self.payload)

    def load(self, directory: Path, saved: TrainerState) -> None:
        pass


def _checkpoint(root: Path, iteration: int, config_hash: str = "abc") -> Path:
    manager = CheckpointManager(root, config_hash=config_hash, keep_last=10)
    return manager.save(TrainerState(iteration, iteration * 2, config_hash, 1, "torch"), _FileDriver(b"w" * iteration))


def test_mirror_keeps_the_previous_checkpoint_until_the_new_one_is_complete(root_uri, tmp_path):
    mirror = CheckpointMirror(root_uri, keep_last=1)
    local = tmp_path / "run" / "checkpoints"
    mirror.publish(_checkpoint(local, 2), 2)
    assert mirror.complete() == [2]
    store = open_store(root_uri)
    # a pod killed while uploading checkpoint 4: files and the claim, no manifest
    store.put_bytes(f"iter-000004/{MARKER_NAME}", b"{}")
    store.put_bytes("iter-000004/torch/model.pt", b"ww")
    assert mirror.complete() == [2] and mirror.newest() == 2  # the previous one is still what resumes
    mirror.publish(_checkpoint(local, 4), 4)  # the next attempt clears the leftovers and publishes
    assert mirror.complete() == [4]
    assert not store.exists(f"iter-000002/{MANIFEST_NAME}") and not store.list("iter-000002")
    assert not store.exists(f"iter-000004/{MARKER_NAME}")
    assert store.get_bytes("iter-000004/torch/model.pt")[0] == b"wwww"
    assert not (tmp_path / "run" / ".mirror-staging" / "iter-000004").exists()

    fresh = tmp_path / "fresh" / "checkpoints"
    assert mirror.restore(fresh, "abc") == 4
    assert is_complete(fresh / "iter-000004") and (fresh / "iter-000004" / "torch" / "model.pt").read_bytes() == b"wwww"
    assert mirror.restore(fresh, "abc") is None  # already there: nothing downloaded again
    with pytest.raises(G2RPOError, match="config hash abc, this run's config hash is other"):
        mirror.restore(tmp_path / "other" / "checkpoints", "other")
    assert not (tmp_path / "other").exists()


def test_a_local_checkpoint_newer_than_the_mirror_is_published_on_restart(tmp_path):
    mirror = CheckpointMirror((tmp_path / "mirror").as_uri(), keep_last=2)
    local = tmp_path / "run" / "checkpoints"
    mirror.publish(_checkpoint(local, 2), 2)
    _checkpoint(local, 4)  # saved, but the pod died before it was mirrored
    assert mirror.restore(local, "abc") is None
    assert mirror.complete() == [2, 4]


def _validated_checkpoint(root: Path, iteration: int, objectives: dict[int, float]) -> Path:
    """A checkpoint whose validation history (iterations 0, 2, … up to ``iteration``) has the given objectives."""
    history = [
        ValidationRecord(i, {}, objective, [], 0, 0.0).as_json()
        for i, objective in objectives.items()
        if i <= iteration
    ]
    manager = CheckpointManager(root, config_hash="abc", keep_last=10)
    state = TrainerState(iteration, iteration * 2, "abc", 1, "torch")
    files = {VALIDATION_FILE: {"identity": {}, "history": history}}
    return manager.save(state, _FileDriver(b"w" * iteration), json_files=files)


def test_mirror_keeps_the_best_validated_checkpoint_and_a_fresh_pod_gets_it_back(root_uri, tmp_path):
    # objectives by iteration: 0 baseline, 2 the best (0.9), 4 and 6 lower -> 2 stays the export
    objectives = {0: 0.5, 2: 0.9, 4: 0.7, 6: 0.6}
    mirror = CheckpointMirror(root_uri, keep_last=1)
    local = tmp_path / "run" / "checkpoints"
    for iteration in (2, 4, 6):
        mirror.publish(_validated_checkpoint(local, iteration, objectives), iteration)
    assert mirror.protected == {2} and mirror.complete() == [2, 6]  # keep_last 1, and the best its history names
    # a pod restarted with a newer local checkpoint (8) publishes it without ever having been told the best
    restarted = CheckpointMirror(root_uri, keep_last=1)
    _validated_checkpoint(local, 8, {**objectives, 8: 0.1})
    assert restarted.restore(local, "abc") is None and restarted.complete() == [2, 8]
    fresh = tmp_path / "fresh" / "checkpoints"
    assert mirror.restore(fresh, "abc") == 8
    assert is_complete(fresh / "iter-000008") and is_complete(fresh / "iter-000002")
    assert (fresh / "iter-000002" / "torch" / "model.pt").read_bytes() == b"ww"


def test_a_mis_shaped_validation_history_is_named_locally_and_in_the_mirror(tmp_path):
    mirror = CheckpointMirror((tmp_path / "mirror").as_uri(), keep_last=2)
    local = tmp_path / "run" / "checkpoints"
    mirror.publish(_validated_checkpoint(local, 2, {0: 0.5, 2: 0.9}), 2)
    # A local checkpoint whose history lacks a field (sealed so: its manifest cannot tell)
    broken = CheckpointManager(local, config_hash="abc", keep_last=10).save(
        TrainerState(4, 8, "abc", 1, "torch"),
        _FileDriver(b"wwww"),
        json_files={VALIDATION_FILE: {"identity": {}, "history": [{"iteration": 4}]}},
    )
    with pytest.raises(
        G2RPOError,
        match=r"iter-000004/validation\.json' is not a valid ValidationFile \(history\.0\.metrics: Field required\): "
        r"delete .*iter-000004 to resume from the checkpoint before it",
    ):
        mirror.publish(broken, 4)  # was a KeyError
    # The mirror's copy of checkpoint 2 with a history that is not a list, published so
    mirrored = tmp_path / "mirror" / "iter-000002"
    (mirrored / VALIDATION_FILE).write_text('{"identity": {}, "history": {"0": 0.5}}')
    manifest = json.loads((mirrored / MANIFEST_NAME).read_text())
    (mirrored / MANIFEST_NAME).unlink()
    write_dir_manifest(mirrored, producer=manifest["producer"], config_hash="abc", metadata=manifest["metadata"])
    with pytest.raises(
        G2RPOError,
        match=r"validation\.json' is not a valid ValidationFile \(history: Input should be a valid array\): it was "
        r"mirrored so .*: delete .*mirror/iter-000002 from the mirror",
    ):
        mirror.restore(tmp_path / "fresh" / "checkpoints", "abc")  # was a TypeError
