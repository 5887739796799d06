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
