"""A checkpoint that meets a full disk or a read-only folder (issue 30): the error names the checkpoint,
the path and the cause — not torch's ``[enforce fail at inline_container.cc] unexpected pos`` — and the
last complete checkpoint stays the one resumed from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.training.checkpoint import CheckpointManager, TrainerState


class _TorchSaveDriver:
    """Writes ``size`` bytes of weights with torch.save, as the plain driver does (the manager is under test)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir()
        torch.save({"w": torch.zeros(self.size // 4)}, directory / "torch" / "model.pt")

    def load(self, directory: Path, saved: TrainerState) -> None:
        pass


def test_full_disk_names_the_checkpoint_the_path_and_the_space(small_disk):
    manager = CheckpointManager(small_disk / "checkpoints", config_hash="abc", keep_last=2)
    manager.save(TrainerState(1, 2, "abc", 1, "torch"), _TorchSaveDriver(256 * 1024))  # fits
    with pytest.raises(G2RPOError) as info:
        manager.save(TrainerState(2, 4, "abc", 1, "torch"), _TorchSaveDriver(8 * 2**20))  # does not
    message = str(info.value)
    assert "checkpoint of iteration 2" in message and str(small_disk / "checkpoints" / "iter-000002") in message
    assert "full" in message or "no space left" in message, message
    assert "MiB free on" in message and "inline_container" not in message.split(". Free space")[0]
    assert manager.latest() == small_disk / "checkpoints" / "iter-000001"  # the complete one stands


def test_read_only_folder_is_named_with_the_cause(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through the permission bits; the tmpfs test covers the root case")
    root = tmp_path / "checkpoints"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(G2RPOError, match="permission denied"):
            CheckpointManager(root, config_hash="abc", keep_last=2).save(
                TrainerState(1, 2, "abc", 1, "torch"), _TorchSaveDriver(1024)
            )
    finally:
        root.chmod(0o700)
