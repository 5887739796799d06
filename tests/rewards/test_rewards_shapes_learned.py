"""The shapes task's learned rewards (g2rpo.rewards.shapes_learned): the pure helpers on hand-worked
values, a whole (tiny) training run through the real open_clip classes and the reward heads that load
it, and the shipped models: sealed, loaded by the ``clip`` and ``hps_v21`` heads, and better than
chance on scenes they never saw."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import shapes_sampler
from g2rpo.rewards.config import RewardModelConfig
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.shapes_learned import (
    REWARD_MARKER,
    SHIPPED_SHAPES_CLIP,
    SHIPPED_SHAPES_PREF,
    RewardPretraining,
    _pairs,
    augment,
    check_reward_folder,
    pretrain_shapes_rewards,
    spearman,
    utility,
)
from g2rpo.tasks.shapes import BACKGROUNDS, COLOURS, Scene, all_scenes, render, unseen_scenes

BASE = SHIPPED_SHAPES_CLIP.parent / "shapes_flux_unseen"


def test_spearman_hand_worked():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, a * 10 + 3) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # ranks of b = [2, 1, 4, 3] → d = [1, 1, 1, 1]; ρ = 1 − 6·4 / (4·15) = 0.6
    assert spearman(a, torch.tensor([20.0, 10.0, 40.0, 30.0])) == pytest.approx(0.6)
    # a tie takes its mean rank: b ranks [0.5, 0.5, 2, 3] against [0, 1, 2, 3]
    tied = spearman(a, torch.tensor([1.0, 1.0, 2.0, 3.0]))
    assert tied == pytest.approx(0.9486833, abs=1e-6)


def test_utility_and_pairs():
    u = utility({"shapes_colour": torch.tensor([1.0, 0.5, 0.9]), "shapes_shape": torch.tensor([0.8, 0.5, 0.9])})
    assert u.tolist() == pytest.approx([0.9, 0.5, 0.9])
    prompts = ["p", "p", "p", "q", "q"]
    u = torch.tensor([0.9, 0.5, 0.9, 0.2, 0.21])
    # p: (0, 1) and (2, 1) differ by 0.4; (0, 2) is a tie; q's pair differs by 0.01 < margin 0.02
    assert _pairs(prompts, u, 0.02).tolist() == [[0, 1], [2, 1]]
    assert _pairs(prompts, u, 0.5).shape == (0, 2)


def test_augment_keeps_range_and_is_seeded():
    scenes = all_scenes()[:6]
    renders = torch.stack([render(s) for s in scenes])
    backgrounds = torch.tensor([BACKGROUNDS[s.background] for s in scenes])
    a = augment(renders, backgrounds, torch.Generator().manual_seed(3))
    b = augment(renders, backgrounds, torch.Generator().manual_seed(3))
    assert a.shape == renders.shape and torch.equal(a, b)
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    assert not torch.equal(a, renders)
    # the shape is still there: the mean distance to the asked colour is smaller inside the shape
    inside = (renders[0] - torch.tensor(COLOURS[scenes[0].colour])[:, None, None]).abs().mean(0) < 1e-6
    near = (a[0] - torch.tensor(COLOURS[scenes[0].colour])[:, None, None]).abs().mean(0)
    assert float(near[inside].mean()) < float(near[~inside].mean())


@pytest.fixture(scope="module")
def tiny_rewards(tmp_path_factory) -> tuple[Path, Path]:
    settings = replace(
        RewardPretraining(), clip_steps=3, clip_batch=16, pref_steps=2, pref_pairs=4, pref_lr=1e-2, sample_steps=(2,)
    )
    settings = replace(settings, samples_per_steps=2)
    return pretrain_shapes_rewards(tmp_path_factory.mktemp("rewards"), shapes_sampler(BASE), settings)


def test_tiny_training_writes_sealed_folders_the_heads_load(tiny_rewards):
    clip_dir, pref_dir = tiny_rewards
    for folder, head in ((clip_dir, "clip"), (pref_dir, "hps_v21")):
        assert check_reward_folder(folder) == folder
        marker = json.loads((folder / REWARD_MARKER).read_text())
        assert marker["head"] == head and marker["trained_scenes"] == 264
        assert marker["unseen"]["unseen_scenes"] == 96
        reward = build_reward(RewardModelConfig(name=head, weights=str(folder)))
        scenes = all_scenes()[:3]
        scores = reward.score(torch.stack([render(s) for s in scenes]), [s.prompt for s in scenes])
        assert scores.shape == (3,) and bool(torch.isfinite(scores).all())
        assert float(scores.abs().max()) <= 1.0 + 1e-5  # a cosine
    pref = json.loads((pref_dir / REWARD_MARKER).read_text())
    assert pref["preference_pairs"] > 0
    # the preference model is the fine-tuned one, not a second copy of the CLIP
    weights = [(folder / "open_clip_model.safetensors").read_bytes() for folder in tiny_rewards]
    assert weights[0] != weights[1]


def test_a_damaged_reward_folder_is_refused(tiny_rewards, tmp_path):
    import shutil

    copy = tmp_path / "pref"
    shutil.copytree(tiny_rewards[1], copy)
    weights = copy / "open_clip_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(G2RPOError, match="differs from its manifest"):
        check_reward_folder(copy)


def test_existing_output_is_refused_without_overwrite_and_foreign_folders_never_replaced(tiny_rewards, tmp_path):
    out = tiny_rewards[0].parent
    with pytest.raises(G2RPOError, match="pass --overwrite"):
        pretrain_shapes_rewards(out, shapes_sampler(BASE))
    (tmp_path / "shapes_clip").mkdir()
    (tmp_path / "shapes_clip" / "thesis.tex").write_text("mine")
    with pytest.raises(G2RPOError, match="not a learned reward folder"):
        pretrain_shapes_rewards(tmp_path, shapes_sampler(BASE), overwrite=True)
    assert (tmp_path / "shapes_clip" / "thesis.tex").read_text() == "mine"


# ----------------------------------------------------------------------------- the shipped models


@pytest.mark.parametrize("folder", [SHIPPED_SHAPES_CLIP, SHIPPED_SHAPES_PREF], ids=["clip", "pref"])
def test_shipped_rewards_are_sealed_and_never_saw_the_unseen_scenes(folder):
    check_reward_folder(folder)
    marker = json.loads((folder / REWARD_MARKER).read_text())
    assert marker["settings"]["unseen"] == 96 and marker["trained_scenes"] == 360 - 96
    assert marker["base_model"] == "shapes_flux_unseen"


def test_shipped_preference_model_is_not_the_clip():
    clip = (SHIPPED_SHAPES_CLIP / "open_clip_model.safetensors").read_bytes()
    assert (SHIPPED_SHAPES_PREF / "open_clip_model.safetensors").read_bytes() != clip


@pytest.mark.parametrize(
    ("folder", "head"), [(SHIPPED_SHAPES_CLIP, "clip"), (SHIPPED_SHAPES_PREF, "hps_v21")], ids=["clip", "pref"]
)
def test_shipped_rewards_prefer_the_asked_colour_on_unseen_scenes(folder, head):
    """On renders of the 96 unseen scenes, each model scores the true prompt above the same prompt with
    another colour far more often than chance (1 in 2 per pair)."""
    reward = build_reward(RewardModelConfig(name=head, weights=str(folder)))
    scenes = sorted(unseen_scenes(96), key=lambda s: s.prompt)
    images = torch.stack([render(s) for s in scenes])
    true = reward.score(images, [s.prompt for s in scenes])
    wins = []
    for other in COLOURS:
        keep = [i for i, s in enumerate(scenes) if s.colour != other]
        wrong = [Scene(s.shape, other, s.size, s.position, s.background).prompt for s in scenes]
        scored = reward.score(images[keep], [wrong[i] for i in keep])
        wins += (true[keep] > scored).tolist()
    assert sum(wins) / len(wins) > 0.8, f"true prompt preferred in {sum(wins)} of {len(wins)} colour swaps"
