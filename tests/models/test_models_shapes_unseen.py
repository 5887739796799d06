"""The shapes model pretrained without its unseen scenes (issue 27: "held-out means unseen").

``ShapesPretraining.unseen = 96`` leaves out the scenes the prepare split (seed 0) holds out first:
the 64 the evaluation holds out and the ablation's 32 validation scenes. The checks: which scenes those
are (the splits' own function decides), that no caption of pretraining names one of them, and that the
shipped folder is that model, sealed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from g2rpo.data import split_prompts
from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import (
    SHIPPED_SHAPES_MODEL,
    ShapesPretraining,
    check_shapes_model,
    pretraining_scenes,
    recoloured_scenes,
)
from g2rpo.tasks.shapes import COLOURS, all_scenes, unseen_scenes

SHIPPED_UNSEEN = SHIPPED_SHAPES_MODEL.parent / "shapes_flux_unseen"


def test_unseen_scenes_are_the_held_out_and_validation_splits():
    prompts = [s.prompt for s in all_scenes()]
    rest, held_out = split_prompts(prompts, 64, seed=0)  # what the pipeline's prepare step holds out
    _, validation = split_prompts(rest, 32, seed=0)  # the ablation's learning-rate split
    unseen = {s.prompt for s in unseen_scenes(96)}
    assert unseen == set(held_out) | set(validation)
    assert {s.prompt for s in unseen_scenes(64)} == set(held_out)
    assert unseen_scenes(0) == set()
    with pytest.raises(G2RPOError, match="count=360"):
        unseen_scenes(360)


def test_pretraining_never_names_an_unseen_scene():
    scenes = pretraining_scenes(ShapesPretraining(unseen=96))
    assert len(scenes) == 264 and not set(scenes) & unseen_scenes(96)
    rows = recoloured_scenes(scenes).tolist()
    for i, (scene, row) in enumerate(zip(scenes, rows)):
        others = {scenes[j] for j in row}
        if others == {scene}:  # no recolouring of it was seen: its caption is never swapped
            assert all(replace(scene, colour=c) not in set(scenes) for c in COLOURS if c != scene.colour)
        else:  # every swap names the same scene in another colour, one that pretraining has
            assert all(o.colour != scene.colour and replace(o, colour=scene.colour) == scene for o in others)
            assert i not in row


def test_with_every_scene_each_row_is_the_other_three_colours_in_order():
    scenes = all_scenes()
    rows = recoloured_scenes(scenes).tolist()
    for scene, row in zip(scenes, rows):
        assert [scenes[j].colour for j in row] == [c for c in COLOURS if c != scene.colour]


def test_shipped_unseen_model_is_sealed_and_records_its_settings():
    assert check_shapes_model(SHIPPED_UNSEEN, ShapesPretraining(unseen=96)) == SHIPPED_UNSEEN
    with pytest.raises(G2RPOError, match="unseen=96"):
        check_shapes_model(SHIPPED_UNSEEN)  # the default settings see every scene


def test_models_made_before_the_setting_existed_read_as_seeing_every_scene():
    assert check_shapes_model(SHIPPED_SHAPES_MODEL) == SHIPPED_SHAPES_MODEL  # its marker has no "unseen"
