"""The shapes task's exact rewards: every scene scores 1 on itself, hand-counted cases for each head,
the prompt grammar, and the heads through the registry and the batched scorer."""

from __future__ import annotations

import math

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.scoring import score_rewards
from g2rpo.rewards.shapes import IN_DOMAIN, IN_DOMAIN_CHECKS, MEASURES, OUT_OF_DOMAIN, scene_scores
from g2rpo.rewards.specs import reward_names
from g2rpo.tasks.shapes import BACKGROUNDS, COLOURS, Scene, all_scenes, parse_prompt, render, shape_mask

SHAPES_HEADS = ("shapes_colour", "shapes_shape", "shapes_position", "shapes_background", "shapes_colour_match")


def test_every_prompt_parses_back_to_its_scene_and_bad_prompts_are_named():
    scenes = all_scenes()
    assert len(scenes) == 3 * 4 * 2 * 5 * 3 == len(set(s.prompt for s in scenes))
    assert all(parse_prompt(s.prompt) == s for s in scenes)
    assert parse_prompt("  A Small Red Circle at the top left on a black background ") == Scene(
        "circle", "red", "small", "top left", "black"
    )
    with pytest.raises(G2RPOError, match=r"prompt='a purple circle': not a shapes prompt; write it as 'a <small"):
        parse_prompt("a purple circle")


def test_each_rendered_scene_scores_one_on_every_head():
    for scene in all_scenes()[::7]:
        assert scene_scores(render(scene), scene.prompt) == pytest.approx(dict.fromkeys(MEASURES, 1.0))


def test_hand_counted_cases():
    scene = Scene("square", "red", "large", "top left", "black")
    size = 64
    # the right square at the bottom right: colour and shape perfect, position off by (32, 32) px
    moved = render(Scene("square", "red", "large", "bottom right", "black"))
    scores = scene_scores(moved, scene.prompt)
    assert scores["shapes_colour"] == pytest.approx(1.0) and scores["shapes_shape"] == pytest.approx(1.0)
    assert scores["shapes_position"] == pytest.approx(1 - math.hypot(32, 32) / (size / math.sqrt(2)))  # = 0
    # the background around the expected place is black except where the moved square is
    square = shape_mask("square", "large", (48.0, 48.0))
    # red against black: mean over RGB of |x − b| = 1/3 on each of the moved square's pixels
    assert scores["shapes_background"] == pytest.approx(1 - float(square.sum()) / 3 / float((~_near(scene)).sum()))
    # a blue square where a red one is asked: non-background pixels are blue, d = mean(|0−1|, 0, |1−0|) = 2/3
    blue = render(Scene("square", "blue", "large", "top left", "black"))
    scores = scene_scores(blue, scene.prompt)
    assert scores["shapes_colour"] == pytest.approx(1 - 2 / 3)
    # blue (0,0,1) is nearer black than red in RGB distance (1 < 2): no red foreground at all
    assert scores["shapes_shape"] == 0.0 and scores["shapes_position"] == 0.0
    # a circle drawn where a square is asked: IoU of the two masks at the same centre
    circle = render(Scene("circle", "red", "large", "top left", "black"))
    c, s = shape_mask("circle", "large", (16.0, 16.0)), shape_mask("square", "large", (16.0, 16.0))
    expected_iou = float((c & s).sum()) / float((c | s).sum())
    assert 0.5 < expected_iou < 1
    assert scene_scores(circle, scene.prompt)["shapes_shape"] == pytest.approx(expected_iou)
    # a plain black image: nothing but background
    empty = scene_scores(torch.zeros(3, size, size), scene.prompt)
    assert empty == {
        "shapes_colour": 0.0,
        "shapes_shape": 0.0,
        "shapes_position": 0.0,
        "shapes_background": 1.0,
        "shapes_colour_match": 0.0,
    }
    # a plain red image (what a colour-only optimum could hack towards): colour 1, background 0
    red = torch.tensor(COLOURS["red"])[:, None, None].expand(3, size, size).clone()
    hacked = scene_scores(red, scene.prompt)
    assert hacked["shapes_colour"] == 1.0 and hacked["shapes_background"] == pytest.approx(1 - 1 / 3)
    assert hacked["shapes_shape"] == pytest.approx(float(s.sum()) / size**2)  # the square inside the full mask
    assert tuple(BACKGROUNDS) == ("black", "white", "gray")


def test_colour_match_is_the_nearest_colour_of_the_task():
    scene = Scene("circle", "red", "large", "center", "black")
    size = 64
    mask = shape_mask("circle", "large", (32.0, 32.0))

    def drawn(rgb):
        return torch.where(mask[None], torch.tensor(rgb)[:, None, None], torch.zeros(3, 1, 1))

    match = lambda image: scene_scores(image, scene.prompt)["shapes_colour_match"]  # noqa: E731
    assert match(drawn((1.0, 0.0, 0.0))) == 1.0
    # what the old VAE gave back for red, (0.40, 0.39, 0.27): squared distances to red 0.36 + 0.1521 +
    # 0.0729 = 0.585, to green 0.16 + 0.1681 + 0.0729 = 0.401, to blue 0.16 + 0.1521 + 0.5329 = 0.845,
    # to yellow 0.36 + 0.3721 + 0.0729 = 0.805: nearest green, so not a red circle
    assert match(drawn((0.40, 0.39, 0.27))) == 0.0
    # orange (1, 0.45, 0): to red 0.2025, to yellow 0.3025 — still red, though shapes_colour says 1 − 0.15
    assert match(drawn((1.0, 0.45, 0.0))) == 1.0
    assert scene_scores(drawn((1.0, 0.45, 0.0)), scene.prompt)["shapes_colour"] == pytest.approx(1 - 0.45 / 3)
    # (1, 0.55, 0): to red 0.3025, to yellow 0.2025 — yellow
    assert match(drawn((1.0, 0.55, 0.0))) == 0.0
    # pixels within 0.2 of the background are not counted: a faint red (0.5, 0, 0) has d_b = 1/6 < 0.2
    assert match(drawn((0.5, 0.0, 0.0))) == 0.0 and match(torch.zeros(3, size, size)) == 0.0


def _near(scene: Scene) -> torch.Tensor:
    mask = shape_mask(scene.shape, scene.size, (16.0, 16.0))
    return torch.nn.functional.max_pool2d(mask[None, None].float(), 5, stride=1, padding=2)[0, 0] > 0


def test_heads_are_registered_and_score_through_the_batched_scorer():
    assert set(SHAPES_HEADS) <= set(reward_names())
    assert set(IN_DOMAIN) | set(IN_DOMAIN_CHECKS) | set(OUT_OF_DOMAIN) == {*SHAPES_HEADS, "jpeg_compressibility"}
    assert not set(IN_DOMAIN) & set(OUT_OF_DOMAIN) and not set(IN_DOMAIN_CHECKS) & (set(IN_DOMAIN) | set(OUT_OF_DOMAIN))
    scenes = all_scenes()[:6]
    images = torch.stack([render(s) for s in scenes])
    prompts = [s.prompt for s in scenes]
    heads = [build_reward(name) for name in SHAPES_HEADS]
    scores = score_rewards(heads, images, prompts, batch_size=4)  # [R, N]
    assert torch.equal(scores, torch.ones(len(SHAPES_HEADS), 6))
    shuffled = score_rewards(heads, images, prompts[::-1], batch_size=4)  # images under other scenes' prompts
    assert bool((shuffled < 1).any())
    with pytest.raises(G2RPOError, match="not a shapes prompt"):
        heads[0].score(images[:1], ["a cat"])


def test_texture_control_scores_the_checker_amplitude_by_size():
    """shapes_texture: t = mean over the foreground of luma × (−1)^(i+j); large shapes score t, small −|t|."""
    from g2rpo.rewards.shapes import CONTROLS, texture_amplitude

    assert "shapes_texture" in reward_names() and "shapes_texture" not in SHAPES_HEADS
    size = 64
    index = torch.arange(size)
    checker = 1.0 - 2.0 * ((index[:, None] + index[None, :]) % 2).float()
    scores = {}
    for scene_size in ("large", "small"):
        scene = Scene("square", "red", scene_size, "center", "black")
        flat = render(scene)
        mask = shape_mask(scene.shape, scene.size, (32.0, 32.0))
        # red (1, 0, 0) ± 0.1 on the checker inside the square: luma 0.299 ± 0.0299, so t = 0.0299 exactly
        textured = flat.clone()
        textured[0] = torch.where(mask, 0.9 + 0.1 * checker, flat[0])
        assert texture_amplitude(textured, mask) == pytest.approx(0.0299, abs=1e-6)
        assert texture_amplitude(flat, mask) == pytest.approx(0.0, abs=1e-6)
        head = build_reward("shapes_texture")
        scores[scene_size] = head.score(torch.stack([flat, textured]), [scene.prompt] * 2)
        assert CONTROLS["shapes_texture"](torch.zeros(3, size, size), scene) == 0.0  # nothing drawn
    assert scores["large"].tolist() == pytest.approx([0.0, 0.0299], abs=1e-6)  # texture asked: more is better
    assert scores["small"].tolist() == pytest.approx([0.0, -0.0299], abs=1e-6)  # flat asked: any texture costs
