"""A checkpoint's ``trainer_state.json`` that does not parse is refused naming the file: as a digest
mismatch when its bytes changed after the save, otherwise naming what is wrong with it — never a
JSONDecodeError or a TypeError from TrainerState (docs/errors.md)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from g2rpo.artifacts.manifest import write_dir_manifest
from g2rpo.errors import G2RPOError
from g2rpo.training.checkpoint import CheckpointManager, TrainerState
from g2rpo.training.run_dir import RunDir


def _checkpoint(root, state: dict):
    directory = root / "iter-000002"
    directory.mkdir(parents=True)
    (directory / "trainer_state.json").write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    write_dir_manifest(directory, producer="test")
    return directory


STATE = asdict(TrainerState(iteration=2, data_cursor=8, config_hash="h", world_size=1, backend="torch"))


def test_an_intact_state_is_read(tmp_path):
    directory = _checkpoint(tmp_path, STATE)
    assert CheckpointManager(tmp_path, config_hash="h", keep_last=2).read_state(directory).iteration == 2


def test_a_state_changed_after_the_save_is_named_by_its_digest(tmp_path):
    directory = _checkpoint(tmp_path, STATE)
    path = directory / "trainer_state.json"
    data = path.read_bytes()
    path.write_bytes(data[:-3] + b"\0\0\0")  # same size: only the sha256 tells
    with pytest.raises(G2RPOError, match=r"does not match its manifest's sha256.*trainer_state\.json"):
        CheckpointManager(tmp_path, config_hash="h", keep_last=2).read_state(directory)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([1, 2], r"holds an array where an object belongs"),
        ({**STATE, "epoch": 3}, r"has unknown field\(s\) epoch \(a TrainerState has backend, config_hash"),
        ({k: v for k, v in STATE.items() if k != "world_size"}, r"lacks world_size"),
    ],
)
def test_a_state_sealed_wrong_is_named(tmp_path, state, message):
    directory = _checkpoint(tmp_path, state)
    with pytest.raises(G2RPOError, match=r"checkpoint state .*trainer_state\.json.* " + message + r".*restore it"):
        CheckpointManager(tmp_path, config_hash="h", keep_last=2).read_state(directory)


def _sealed(root, iteration: int):
    directory = root / f"iter-{iteration:06d}"
    directory.mkdir(parents=True)
    state = {**STATE, "iteration": iteration}
    (directory / "trainer_state.json").write_text(json.dumps(state, sort_keys=True), encoding="utf-8")
    (directory / "weights.bin").write_bytes(bytes(range(256)) * 4)
    write_dir_manifest(directory, producer="test")
    return directory


def test_a_checkpoint_whose_manifest_was_damaged_is_set_aside_not_taken_for_a_save_cut_short(tmp_path):
    # The manifest is written last and removed first, so no kill leaves one that does not read: such a
    # checkpoint is damage, reported and kept as iter-N.damaged like one whose sha256 differs — never
    # treated as incomplete, which would let the next save of that iteration delete it.
    _sealed(tmp_path, 2)
    newest = _sealed(tmp_path, 4)
    manifest = newest / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-40])
    skipped = []
    manager = CheckpointManager(tmp_path, config_hash="h", keep_last=2)
    assert manager.latest_verified(skipped.append) == tmp_path / "iter-000002"
    assert not newest.exists() and (tmp_path / "iter-000004.damaged" / "weights.bin").is_file()
    assert skipped[0]["event"] == "checkpoint_skipped" and "manifest.json" in skipped[0]["reason"]


def test_only_broken_checkpoints_stop_the_resume_listing_them(tmp_path):
    only = _sealed(tmp_path, 2)
    (only / "weights.bin").write_bytes(b"cut")  # a listed file shrank after the manifest was written
    with pytest.raises(
        G2RPOError, match=r"(?s)no checkpoint in .* matches.*iter-000002: .*weights\.bin: size 3, manifest says 1024"
    ):
        CheckpointManager(tmp_path, config_hash="h", keep_last=2).latest_verified()
    assert (only / "weights.bin").read_bytes() == b"cut"  # nothing moved or removed


def test_a_run_config_that_is_not_a_text_file_is_named(tmp_path):
    out = tmp_path / "run"
    (out / "config.yaml").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"iteration": 0}\n')
    manager = CheckpointManager(out / "checkpoints", config_hash="h", keep_last=2)
    with pytest.raises(G2RPOError, match=r"run config '.*config\.yaml' is a directory, not a text file"):
        manager.resume_point("auto", RunDir(out), "train: {}\n")
