"""Tiny reward weights in the official layouts, written once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_hps(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_hps

    return write_tiny_hps(tmp_path_factory.mktemp("hps"))


@pytest.fixture(scope="session")
def tiny_image_reward(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_image_reward

    return write_tiny_image_reward(tmp_path_factory.mktemp("image_reward"))


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_open_clip_dir

    # seed 1: not the tiny HPS model's seed 0, so a mixed-up builder would change the scores
    return write_tiny_open_clip_dir(tmp_path_factory.mktemp("clip"), seed=1)


@pytest.fixture(scope="session")
def tiny_pickscore(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_pickscore_dir

    return write_tiny_pickscore_dir(tmp_path_factory.mktemp("pickscore"))


@pytest.fixture(scope="session")
def tiny_aesthetic(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_aesthetic

    return write_tiny_aesthetic(tmp_path_factory.mktemp("aesthetic"))


@pytest.fixture(scope="session")
def tiny_unified_reward(tmp_path_factory):
    from g2rpo.rewards.tiny import write_tiny_unified_reward

    return write_tiny_unified_reward(tmp_path_factory.mktemp("unified_reward"))


@pytest.fixture(scope="session")
def tiny_answering_judge(tmp_path_factory):
    """The tiny judge rewired to answer "Final Score: 2.35" (the official answer's last line, with
    decimals) to any image and caption: the random judge writes no score."""
    from g2rpo.rewards.tiny import write_tiny_unified_reward

    return write_tiny_unified_reward(tmp_path_factory.mktemp("answering_judge"), answer="Final Score: 2.35")["dir"]
