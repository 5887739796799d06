"""The shapes task's exact rewards: every scene scores 1 on itself, hand-counted cases for each head,
the prompt grammar, and the heads through the registry and the batched scorer."""

from __future__ import annotations

import math

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.registry import build_reward, reward_names
from g2rpo.rewards.scoring import score_rewards
from g2rpo.rewards.shapes import IN_DOMAIN, MEASURES, OUT_OF_DOMAIN, scene_scores
from g2rpo.tasks.shapes import BACKGROUNDS, COLOURS, Scene, all_scenes, parse_prompt, render, shape_mask

SHAPES_HEADS = ("shapes_colour", "shapes_shape", "shapes_position", "shapes_background")


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
    assert empty == {"shapes_colour": 0.0, "shapes_shape": 0.0, "shapes_position": 0.0, "shapes_background": 1.0}
    # a plain red image (what a colour-only optimum could hack towards): colour 1, background 0
    red = torch.tensor(COLOURS["red"])[:, None, None].expand(3, size, size).clone()
    hacked = scene_scores(red, scene.prompt)
    assert hacked["shapes_colour"] == 1.0 and hacked["shapes_background"] == pytest.approx(1 - 1 / 3)
    assert hacked["shapes_shape"] == pytest.approx(float(s.sum()) / size**2)  # the square inside the full mask
    assert tuple(BACKGROUNDS) == ("black", "white", "gray")


def _near(scene: Scene) -> torch.Tensor:
    mask = shape_mask(scene.shape, scene.size, (16.0, 16.0))
    return torch.nn.functional.max_pool2d(mask[None, None].float(), 5, stride=1, padding=2)[0, 0] > 0


def test_heads_are_registered_and_score_through_the_batched_scorer():
    assert set(SHAPES_HEADS) <= set(reward_names())
    assert set(IN_DOMAIN) | set(OUT_OF_DOMAIN) == {*SHAPES_HEADS, "jpeg_compressibility"}
    assert not set(IN_DOMAIN) & set(OUT_OF_DOMAIN)
    scenes = all_scenes()[:6]
    images = torch.stack([render(s) for s in scenes])
    prompts = [s.prompt for s in scenes]
    heads = [build_reward(name) for name in SHAPES_HEADS]
    scores = score_rewards(heads, images, prompts, batch_size=4)  # [R, N]
    assert torch.equal(scores, torch.ones(4, 6))
    shuffled = score_rewards(heads, images, prompts[::-1], batch_size=4)  # images under other scenes' prompts
    assert bool((shuffled < 1).any())
    with pytest.raises(G2RPOError, match="not a shapes prompt"):
        heads[0].score(images[:1], ["a cat"])
