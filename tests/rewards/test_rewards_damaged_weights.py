"""A reward folder whose bytes differ from its manifest is refused before it scores (issue 43): a
copy of a learned shapes reward with one flipped bit scored (the same score, exit 0) and ``train``
trained against it, while base models were verified."""

from __future__ import annotations

import shutil

import pytest
import torch
from PIL import Image

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.rewards.config import RewardModelConfig
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.shapes_learned import SHIPPED_SHAPES_CLIP, SHIPPED_SHAPES_PREF

WEIGHTS = "open_clip_model.safetensors"


def _flipped_copy(folder, tmp_path):
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    weights = copy / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight: still a readable safetensors file
    weights.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize(("folder", "head"), [(SHIPPED_SHAPES_CLIP, "clip"), (SHIPPED_SHAPES_PREF, "hps_v21")])
def test_a_reward_folder_with_one_flipped_bit_is_refused_naming_the_file(folder, head, tmp_path):
    intact = tmp_path / "intact"
    shutil.copytree(folder, intact)
    build_reward(RewardModelConfig(name=head, weights=str(intact)))  # the control: an intact copy loads
    damaged = _flipped_copy(folder, tmp_path)
    with pytest.raises(G2RPOError) as info:
        build_reward(RewardModelConfig(name=head, weights=str(damaged)))
    message = str(info.value)
    assert f"{head}.weights folder {str(damaged)!r} does not match its manifest.json" in message, message
    assert f"{WEIGHTS}: sha256" in message and "do not use it" in message


def test_a_weights_file_inside_a_damaged_folder_is_refused(tmp_path):
    damaged = _flipped_copy(SHIPPED_SHAPES_CLIP, tmp_path)
    config = RewardModelConfig(
        name="clip", weights=str(damaged / WEIGHTS), arch_config=str(damaged / "open_clip_config.json")
    )
    with pytest.raises(G2RPOError, match=f"{WEIGHTS}: sha256"):
        build_reward(config)


def test_rewards_score_refuses_a_damaged_folder(tmp_path, capsys):
    damaged = _flipped_copy(SHIPPED_SHAPES_PREF, tmp_path)
    image = tmp_path / "a.png"
    Image.fromarray((torch.rand(64, 64, 3) * 255).to(torch.uint8).numpy()).save(image)
    argv = ["rewards", "score", "hps_v21", str(image), "--prompt", "a red circle", "--weights", str(damaged)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "does not match its manifest.json" in err and "Traceback" not in err, err
